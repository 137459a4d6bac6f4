"""Every ```python block of README.md and docs/**/*.md runs, against the local services.

Each block runs in a fresh namespace, with the current directory a temporary directory of its
own, after the blocks its ``<!-- after: NAME -->`` marker names (in the same namespace). A block
marked ``<!-- no-run: REASON -->`` is not run. Before running, every name a block uses must be
defined by the block, its setup blocks or the builtins -- also names used only inside
functions that the block never calls -- so an example cannot quietly rely on something it does
not show. The conventions are described in docs/reference/development.md.

Blocks name the local services by their documented URLs. So that the blocks of parallel runs
never see each other's state, each run gets servers of its own behind those URLs: a fresh
PostgreSQL and MySQL database per block (``.../test`` is rewritten to it) and a disposable
redis-server per test process, emptied before each block (``redis://127.0.0.1:6379`` is
rewritten to it). RabbitMQ blocks use queue names of their own.

Each page is also run as a newcomer would follow it: all its runnable blocks in the order the
page shows them, in one process and one namespace, then the whole page again in a new process on
the same databases, Redis and directory (an example run twice must still work: no hang on a
message already handled, no key already used by an earlier example of the page).

A block that, after its setup blocks, is how its page's ordered run starts (the page's first
block, or one whose setups are every block above it) is run by that ordered run, which starts
on fresh servers in a fresh directory just as the block's own run would: its own test checks
only the names it uses.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import re
import subprocess
import symtable
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..reliability._redis_server import RedisServer
from ..servers import mysql_params
from .blocks import ROOT, Block, all_blocks

BLOCKS = all_blocks()
RUNNABLE = [b for b in BLOCKS if b.no_run is None]
BY_NAME = {(b.page, b.name): b for b in BLOCKS if b.name}


def _setup_chain(block: Block, seen: list[Block] | None = None) -> list[Block]:
    """The blocks to run before ``block``, in order, each once (their own setups first)."""
    seen = [] if seen is None else seen
    for name in block.after:
        setup = BY_NAME[(block.page, name)]
        if setup in seen:
            continue
        _setup_chain(setup, seen)
        if setup not in seen:
            seen.append(setup)
    return seen


def _defined(code: str, filename: str) -> set[str]:
    """The names a block binds at module level (assignments, imports, defs, classes)."""
    table = symtable.symtable(code, filename, "exec")
    names = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    # ``global x`` inside a function that assigns it also defines x
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        names |= {
            s.get_name() for s in child.get_symbols() if s.is_declared_global() and s.is_assigned()
        }
        stack.extend(child.get_children())
    return names


def _used_globals(code: str, filename: str) -> dict[str, int]:
    """Names a block reads from the module namespace, in any scope, with a line for each."""
    table = symtable.symtable(code, filename, "exec")
    used: dict[str, int] = {}
    stack = [table]
    while stack:
        scope = stack.pop()
        top = scope.get_type() == "module"
        for symbol in scope.get_symbols():
            if not symbol.is_referenced():
                continue
            if top or symbol.is_global():
                used.setdefault(symbol.get_name(), scope.get_lineno())
        stack.extend(scope.get_children())
    return used


POSTGRES = re.compile(r"postgresql(\+\w+)?://postgres@127\.0\.0\.1(:5432)?/test\b")
MYSQL = re.compile(r"mysql(\+\w+)?://root@127\.0\.0\.1(:3306)?/test\b")
REDIS = re.compile(r"redis://127\.0\.0\.1(:6379)?(?=[/?\"'\s]|$)")


class Servers:
    """Where this block's documented URLs lead: databases and a Redis of its own."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.postgres: str | None = None
        self.mysql: str | None = None

    def rewrite(self, code: str) -> str:
        if self.postgres:
            db = self.postgres
            code = POSTGRES.sub(
                lambda m: f"postgresql{m.group(1) or ''}://postgres@127.0.0.1:5432/{db}", code
            )
        if self.mysql:
            db = self.mysql
            code = MYSQL.sub(lambda m: f"mysql{m.group(1) or ''}://root@127.0.0.1:3306/{db}", code)
        return REDIS.sub(self.redis_url, code)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def servers(redis_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[Servers]:
    import psycopg
    import pymysql
    import redis

    client = redis.Redis(port=redis_server.port)
    client.flushall()
    client.close()
    servers = Servers(f"redis://127.0.0.1:{redis_server.port}")
    param = request.param
    chain: list[Block]
    if isinstance(param, list):
        chain = _in_order(param)
    elif _opens_its_page(param):
        chain = []  # not run here: its page's ordered run runs it (see test_block_runs)
    else:
        chain = [*_setup_chain(param), param]
    code = "".join(b.code for b in chain)
    name = f"docs_{uuid.uuid4().hex[:12]}"
    if POSTGRES.search(code):
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        servers.postgres = name
    if MYSQL.search(code):
        with pymysql.connect(**mysql_params(), autocommit=True) as c, c.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        servers.mysql = name
    try:
        yield servers
    finally:
        if servers.postgres:
            with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if servers.mysql:
            with pymysql.connect(**mysql_params(), autocommit=True) as c, c.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {name}")


def _source(block: Block, servers: Servers | None = None) -> str:
    code = block.code if servers is None else servers.rewrite(block.code)
    # blank lines in front so that tracebacks give the page's line numbers
    return "\n" * block.line + code


#: runs the blocks it reads from stdin, in order, in one fresh ``__main__`` namespace; a block
#: with a file name is also written to that file (in the current directory) when its turn comes
DRIVER = """
import json, sys

def main(blocks):
    import importlib
    import __main__
    namespace = __main__.__dict__
    for name in [n for n in namespace if not n.startswith("__")] + ["__file__"]:
        namespace.pop(name, None)
    for filename, source, file, text in blocks:
        if file is not None:
            with open(file, "w", encoding="utf-8") as f:
                f.write(text)
            importlib.invalidate_caches()
        exec(compile(source, filename, "exec"), namespace)

main(json.load(sys.stdin))
"""


def _run(label: str, blocks: list[Block], servers: Servers, cwd: Path, timeout: float) -> None:
    """Runs ``blocks`` in order in one new process (see :data:`DRIVER`), in ``cwd``; ``label``
    names what failed."""
    # a process of its own: a fresh namespace, the environment's commands (jobfence, ...) on
    # PATH, the current directory importable (for the blocks written to files), no inherited
    # JOBFENCE_URL
    env = {k: v for k, v in os.environ.items() if k != "JOBFENCE_URL"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    payload = [
        [b.page, _source(b, servers), b.file, servers.rewrite(b.code) if b.file else None]
        for b in blocks
    ]
    try:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER],
            input=json.dumps(payload),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{label} did not finish in {timeout:.0f} s:\n{exc.stderr!r}\n{exc.stdout!r}"
        ) from None
    assert done.returncode == 0, (
        f"{label} failed (exit {done.returncode}):\n{done.stderr}\n{done.stdout}"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("block", "servers"),
    [(b, b) for b in RUNNABLE],
    ids=[b.id for b in RUNNABLE],
    indirect=["servers"],
)
def test_block_runs(block: Block, servers: Servers, tmp_path: Path) -> None:
    chain = [*_setup_chain(block), block]
    defined = set(dir(builtins)) | {"__name__", "__file__"}
    for each in chain:
        defined |= _defined(_source(each), each.page)
    undefined = sorted(set(_used_globals(_source(block), block.page)) - defined)
    assert not undefined, (
        f"{block.id} uses {undefined} without defining them: define them in the block, name "
        "the block that does with <!-- after: NAME -->, or mark it <!-- no-run: REASON -->"
    )

    if _opens_its_page(block):
        # these blocks, on fresh servers in a fresh directory, are how the page's ordered run
        # (test_page_runs_in_order_twice) starts: that run is this block's run
        return
    _run(block.id, chain, servers, tmp_path, timeout=100)


def _opens_its_page(block: Block) -> bool:
    """Whether ``block`` after its setup blocks is the start of its page's ordered run, block
    for block (a page's first block, or one whose setups are every block above it)."""
    chain = [*_setup_chain(block), block]
    return _in_order(PAGES[block.page])[: len(chain)] == chain


def _in_order(blocks: list[Block]) -> list[Block]:
    """A page's runnable ``blocks`` in the page's order, each once; a block whose setup blocks
    come later on the page (``<!-- after: NAME -->`` naming a block further down) gets them
    run just before it."""
    ordered: list[Block] = []
    for block in blocks:
        for setup in [*_setup_chain(block), block]:
            if setup not in ordered:
                ordered.append(setup)
    return ordered


PAGES: dict[str, list[Block]] = {}
for _block in RUNNABLE:
    PAGES.setdefault(_block.page, []).append(_block)


#: pages whose examples cannot run twice on the same servers, and why
RUN_ONCE = {
    "docs/how-to/arq.md": "arq keeps job order-1's result in Redis for an hour and refuses its "
    "id meanwhile, which the page shows",
}


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("blocks", "servers"),
    [(b, b) for b in PAGES.values()],
    ids=list(PAGES),
    indirect=["servers"],
)
def test_page_runs_in_order_twice(blocks: list[Block], servers: Servers, tmp_path: Path) -> None:
    ordered = _in_order(blocks)
    _run(blocks[0].page, ordered, servers, tmp_path, timeout=180)
    if blocks[0].page in RUN_ONCE:
        return
    # the same page again, as a reader running it a second time would: same databases, same
    # Redis, same directory (its SQLite files), a new process
    _run(f"{blocks[0].page}, run again", ordered, servers, tmp_path, timeout=180)


def test_no_run_blocks_say_why() -> None:
    for block in BLOCKS:
        if block.no_run is not None:
            assert len(block.no_run.split()) >= 3, f"{block.id}: no-run needs a real reason"


@pytest.mark.parametrize(
    ("page", "at_least"), [("docs/how-to/testing.md", 5), ("docs/concepts/inbox.md", 3)]
)
def test_pages_keep_their_runnable_examples(page: str, at_least: int) -> None:
    assert (ROOT / page).is_file(), page
    assert len([b for b in RUNNABLE if b.page == page]) >= at_least


def test_a_block_using_names_it_does_not_define_is_caught() -> None:
    """The README's exactly-once example once used psycopg, DSN and locks undefined; the
    check finds such names, also inside functions the block never calls."""
    code = (
        "import jobfence\n"
        "inbox = jobfence.Inbox('memory://')\n"
        "def apply(order_id):\n"
        "    with psycopg.connect(DSN) as conn:\n"
        "        inbox.claim_in(conn, f'order:{order_id}')\n"
        "@jobfence.guarded(locks=locks, inbox=inbox, key='order:{order_id}')\n"
        "def process(order_id):\n"
        "    return [x for x in range(order_id)]\n"
    )
    used = set(_used_globals(code, "example")) - _defined(code, "example") - set(dir(builtins))
    assert used == {"psycopg", "DSN", "locks"}


#: the README's guarded worker, and the queue and inbox URLs its comments offer instead
README_WORKER = next(b for b in RUNNABLE if b.page == "README.md" and "queue_url = " in b.code)
README_ALTERNATIVES = [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("sqlite:///jobs.db", "sqlite:///jobs.db"),
    ("amqp://guest:guest@127.0.0.1:5672/", "sqlite:///jobs.db"),
]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("queue_url", "inbox_url"), README_ALTERNATIVES)
def test_the_readme_worker_runs_on_the_urls_its_comments_offer(
    queue_url: str, inbox_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    lines = README_WORKER.code.splitlines()
    queue_line = next(i for i, line in enumerate(lines) if line.startswith("queue_url = "))
    inbox_line = next(i for i, line in enumerate(lines) if line.startswith("inbox_url = "))
    # the comments name these alternatives (a scheme, or the whole URL)
    assert queue_url.split("//")[0] + "//" in lines[queue_line].split("#", 1)[1]
    assert inbox_url.split("//")[0] + "//" in lines[inbox_line].split("#", 1)[1]
    lines[queue_line] = f"queue_url = {queue_url!r}"
    lines[inbox_line] = f"inbox_url = {inbox_url!r}"
    code = "\n".join(lines) + "\n"
    if queue_url.startswith("amqp:"):  # RabbitMQ is shared: a queue of this test's own
        code = code.replace('"orders"', repr(f"orders-{uuid.uuid4().hex[:8]}")) + "queue.drop()\n"
    block = dataclasses.replace(README_WORKER, code=code)
    servers = Servers(f"redis://127.0.0.1:{redis_server.port}")
    _run(f"README worker on {queue_url}", [block], servers, tmp_path, timeout=60)
    _run(f"README worker on {queue_url}, run again", [block], servers, tmp_path, timeout=60)
