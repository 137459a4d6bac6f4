"""``guarded(limit=("tenant:{tenant_id}", n))`` on Redis and PostgreSQL: at most ``n`` calls
run at once per formatted name; a call over the limit raises ``LimitReached`` (a ``NotNow``
with a ``retry_after``) without running; other names are not held back."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import pytest
from click.testing import CliRunner

import jobfence
from jobfence.cli.app import cli
from tests.servers import POSTGRES_URL, REDIS_URL

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["redis", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    return REDIS_URL if request.param == "redis" else POSTGRES_URL


def _namespace() -> str:
    return "jf_lim_" + uuid.uuid4().hex[:8]


def test_a_call_over_the_limit_is_refused_not_now_and_others_run(url: str) -> None:
    entered = threading.Semaphore(0)
    go = threading.Event()
    running: list[str] = []
    with jobfence.Locks(url, namespace=_namespace()) as locks:

        @jobfence.guarded(locks=locks, limit=("tenant:{tenant_id}", 2), ttl=5)
        def work(tenant_id: int, n: int) -> int:
            running.append(f"{tenant_id}:{n}")
            entered.release()
            assert go.wait(30)
            return n

        threads = [threading.Thread(target=work, args=(1, n)) for n in range(2)]
        for thread in threads:
            thread.start()
        for _ in threads:
            assert entered.acquire(timeout=20)
        with pytest.raises(jobfence.LimitReached) as info:
            work(1, 99)
        err = info.value
        assert isinstance(err, jobfence.NotNow) and err.limit == 2 and err.name == "tenant:1"
        assert err.retry_after is not None and 0 < err.retry_after <= 5
        assert "1:99" not in running  # refused: it did not run
        other = threading.Thread(target=work, args=(2, 7))  # another tenant is not held back
        other.start()
        assert entered.acquire(timeout=20)
        go.set()
        for thread in [*threads, other]:
            thread.join(20)
        assert work(1, 5) == 5  # the limit's leases were given back
        assert locks.holders("tenant:") == []


def test_async_guarded_limit_with_a_lock(url: str) -> None:
    async def main() -> None:
        async with jobfence.AsyncLocks(url, namespace=_namespace()) as locks:
            inside = 0
            most = 0
            gate = asyncio.Event()

            @jobfence.guarded(locks=locks, lock="job:{n}", limit=("tenant:{tenant_id}", 3), ttl=5)
            async def work(tenant_id: int, n: int) -> int:
                nonlocal inside, most
                inside += 1
                most = max(most, inside)
                lease = jobfence.current_lease()
                assert lease is not None and lease.name == f"job:{n}"  # the lock's lease
                await gate.wait()
                inside -= 1
                return n

            tasks = [asyncio.ensure_future(work(1, n)) for n in range(5)]
            await asyncio.sleep(0)
            deadline = asyncio.get_running_loop().time() + 20
            # the two over the limit are refused and the three admitted are all inside
            while sum(t.done() for t in tasks) < 2 or inside < 3:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            gate.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            refused = [r for r in results if isinstance(r, jobfence.LimitReached)]
            assert len(refused) == 2 and most == 3
            assert sorted(r for r in results if isinstance(r, int)) == sorted(
                set(range(5)) - {n for n, r in enumerate(results) if isinstance(r, Exception)}
            )

    asyncio.run(main())


def test_bad_limit_arguments_are_refused_at_decoration() -> None:
    with jobfence.Locks("memory://") as locks:
        for bad, argument in (
            (("t:{x}", 0), "limit"),
            (("t:{x}", True), "limit"),
            (("t:{x}", 1001), "limit"),
            ("t:{x}", "limit"),
            (("t:{nope}", 2), "limit"),
        ):
            with pytest.raises(jobfence.ConfigurationError) as info:
                jobfence.guarded(locks=locks, limit=bad)(lambda x: x)  # type: ignore[arg-type]
            assert info.value.argument == argument, bad
        with pytest.raises(jobfence.ConfigurationError) as info:
            jobfence.guarded(inbox=object(), limit=("t:{x}", 2))(lambda x: x)
        assert info.value.argument == "locks"


def test_the_cli_lists_a_limits_leases_under_its_name() -> None:
    namespace = _namespace()
    with jobfence.Locks(REDIS_URL, namespace=namespace) as locks:
        leases = [locks.try_acquire("tenant:3", ttl=30, limit=3) for _ in range(2)]
        result = CliRunner().invoke(
            cli,
            ["locks", "list", REDIS_URL, "--namespace", namespace, "--json"],
            catch_exceptions=False,
        )
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in result.output.splitlines()]
        assert [row["name"] for row in rows] == ["tenant:3", "tenant:3"]
        assert sorted(row["token"] for row in rows) == sorted(
            lease.token for lease in leases if lease is not None
        )
        for lease in leases:
            assert lease is not None and lease.release()
