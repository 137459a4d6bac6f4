"""The etcd checks of the doctor (``jobfence.backends.etcd.doctor.inspect``) against this
worker's one-member etcd (``tests/etcd_cluster.py``)."""

from __future__ import annotations

from jobfence._core.url import parse_url
from jobfence.backends.etcd.doctor import inspect
from jobfence.doctor import Report, Timer
from tests.etcd_cluster import etcd_url


def test_a_single_member_is_healthy_but_warned_about() -> None:
    url = parse_url(etcd_url())
    report = Report(url=url.masked, backend="etcd", namespace="jobfence")
    inspect(report, url, Timer(3))
    codes = {f.code: f.level for f in report.findings}
    assert report.server_version is not None and report.server_version.startswith("etcd 3.")
    assert codes["etcd-version"] == "ok" and codes["etcd-health"] == "ok"
    assert codes["etcd-member-count"] == "warning"
    assert report.rtt_ms is not None and report.rtt_ms > 0
    assert report.clock_offset_ms is None


def test_jobfence_doctor_finds_the_etcd_checks_through_the_registry() -> None:
    """``diagnose`` (what ``jobfence doctor`` runs) reaches ``backends/etcd/doctor.py`` by the
    registry's convention, and its probe lease goes through the etcd lock backend."""
    from jobfence.doctor import diagnose

    report = diagnose(etcd_url(), namespace="doctor-probe")
    codes = {f.code: f.level for f in report.findings}
    assert report.backend == "etcd"
    assert codes["etcd-health"] == "ok", report.findings
    assert report.server_version is not None and report.server_version.startswith("etcd 3.")
    assert not [f for f in report.findings if f.level == "error"], report.findings
