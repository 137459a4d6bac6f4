"""etcd checks of ``jobfence doctor``: ``inspect(report, url, timer)``, as the server modules
of :mod:`jobfence.doctor` have it.

It checks that the URL's endpoints answer, the server's version (3.4 or later: the JSON
gateway paths jobfence calls), the cluster's health (every member listed by
``cluster/member/list`` answers ``maintenance/status``, they agree on one leader, and a quorum
of them answers), the member count (1 survives no failure and 2 is no better: a quorum of 2
needs both), and whether the URL names every member (so that the client can fail over).
Round trips are timed on a linearizable read, which every lock and inbox call pays at least
once. Clocks are not involved in leases (etcd keeps them), so no clock offset is measured.
"""

from __future__ import annotations

from typing import Any

from ..._core.url import BackendURL
from .client import EtcdClient, connect_etcd

__all__ = ["MIN_VERSION", "inspect"]

MIN_VERSION = (3, 4)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _member_status(client: EtcdClient, member: dict[str, Any]) -> dict[str, Any] | None:
    for endpoint in member.get("clientURLs", ()):
        try:
            return client.status(endpoint)
        except Exception:
            continue
    return None


def inspect(report: Any, url: BackendURL, timer: Any) -> None:
    """Fill ``report`` (a :class:`jobfence.doctor.Report`) with the checks of the etcd at
    ``url``; raises when no endpoint answers (the doctor reports it as unreachable)."""
    options: dict[str, Any] = {}
    client = connect_etcd(url, options, what="etcd doctor")
    try:
        status = client.status()
        version = str(status.get("version", "?"))
        report.server_version = f"etcd {version}"
        if _version(version) < MIN_VERSION:
            report.add(
                "error",
                "etcd-version",
                f"etcd {version} is older than 3.4",
                "upgrade etcd to 3.4 or later: jobfence calls the v3 JSON gateway paths of 3.4",
            )
        else:
            report.add("ok", "etcd-version", report.server_version)
        report.rtt_ms = timer.ping(lambda: client.range("jobfence-doctor/ping"))
        report.clock_note = (
            "not involved in leases: etcd keeps them; inbox deadlines compare the workers' "
            "clocks (keep them in NTP sync)"
        )
        members = client.members()
        answers = {str(m.get("ID")): _member_status(client, m) for m in members}
        alive = [s for s in answers.values() if s is not None]
        leaders = {str(s.get("leader", "0")) for s in alive} - {"0"}
        total = len(members)
        quorum = total // 2 + 1
        silent = [
            str(m.get("name") or m.get("ID")) for m in members if answers[str(m.get("ID"))] is None
        ]
        if len(alive) < quorum:
            report.add(
                "error",
                "etcd-quorum",
                f"{len(alive)} of {total} members answer: no quorum ({quorum} needed)",
                "bring members back: without a quorum etcd serves no lock or inbox call",
            )
        elif len(leaders) != 1:
            report.add(
                "error",
                "etcd-leader",
                f"the members answering name {len(leaders)} leaders ({sorted(leaders)})",
                "wait for the election to settle; check the members' network and logs",
            )
        elif silent:
            report.add(
                "warning",
                "etcd-members",
                f"{len(alive)} of {total} members answer; silent: {', '.join(silent)}",
                "the cluster keeps its quorum, but tolerates fewer failures until they return",
            )
        else:
            report.add("ok", "etcd-health", f"all {total} members answer; one leader")
        if total == 1:
            report.add(
                "warning",
                "etcd-member-count",
                "a single member: its failure stops every lock and inbox call",
                "run 3 (or 5) members in production",
            )
        elif total == 2:
            report.add(
                "warning",
                "etcd-member-count",
                "2 members are no better than 1: a quorum of 2 needs both",
                "run 3 (or 5) members in production",
            )
        elif total % 2 == 0:
            report.add(
                "warning",
                "etcd-member-count",
                f"{total} members tolerate as many failures as {total - 1}",
                "run an odd number of members",
            )
        else:
            report.add(
                "ok",
                "etcd-member-count",
                f"{total} members: tolerates {(total - 1) // 2} failure(s)",
            )
        listed = {e.split("://", 1)[-1] for e in client.endpoints}
        served = {u.split("://", 1)[-1] for m in members for u in m.get("clientURLs", ()) if u}
        if total > 1 and not served <= listed:
            report.add(
                "warning",
                "etcd-endpoints",
                f"the URL names {len(listed)} of the cluster's {total} members",
                "name every member in the URL (etcd://h1:2379,h2:2379,h3:2379) so that the "
                "client fails over when one is down",
            )
    finally:
        client.close()
