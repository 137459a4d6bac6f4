"""The dashboard's pure parts: which Host headers the server answers, the page's token, the
masking of errors, option checks, and the panels a backend has no part for."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from jobfence.dashboard import Dashboard, DashboardConfig, make_server
from jobfence.dashboard.server import DashboardServer
from jobfence.dashboard.state import masked_error
from jobfence.errors import BackendError, ConfigurationError


@pytest.fixture
def board() -> Iterator[Dashboard]:
    dashboard = Dashboard(DashboardConfig(urls=("memory://",)))
    yield dashboard
    dashboard.close()


def _server(board: Dashboard, host: str = "127.0.0.1", **kw: bool) -> DashboardServer:
    return make_server(board, host, 0, **kw)


def test_a_loopback_server_answers_only_to_loopback_names_on_its_port(board: Dashboard) -> None:
    server = _server(board)
    try:
        port = server.port
        assert server.url == f"http://127.0.0.1:{port}/"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}"):
            assert server.host_allowed(host), host
        for host in (
            None,
            "",
            "127.0.0.1",  # no port: port 80
            f"127.0.0.1:{port + 1}",
            f"attacker.example:{port}",
            f"localhost.attacker.example:{port}",
            f"10.0.0.1:{port}",  # an address, but not the bound one
            f"[::1:{port}",
            f"127.0.0.1:{port}@attacker.example",
        ):
            assert not server.host_allowed(host), host
    finally:
        server.server_close()


def test_a_server_bound_to_all_interfaces_answers_to_addresses_not_foreign_names(
    board: Dashboard,
) -> None:
    server = _server(board, "0.0.0.0")
    try:
        port = server.port
        assert server.url == f"http://127.0.0.1:{port}/"
        assert server.host_allowed(f"10.1.2.3:{port}")
        assert server.host_allowed(f"localhost:{port}")
        assert not server.host_allowed(f"attacker.example:{port}")
        assert not server.host_allowed(f"10.1.2.3:{port + 1}")
    finally:
        server.server_close()


def test_only_an_address_other_machines_can_reach_is_warned_about(
    board: Dashboard, caplog: pytest.LogCaptureFixture
) -> None:
    for host in ("127.0.0.1", "localhost", "::1"):
        with caplog.at_level(logging.WARNING, logger="jobfence.dashboard"):
            server = _server(board, host, allow_actions=True)
        try:
            assert server.loopback and server.exposure_warning() is None, host
        finally:
            server.server_close()
    assert caplog.records == []
    for host, actions in (("0.0.0.0", True), ("::", False), ("0.0.0.0", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jobfence.dashboard"):
            server = _server(board, host, allow_actions=actions)
        try:
            warning = server.exposure_warning()
            assert not server.loopback and warning is not None
            assert f":{server.port} (every interface)" in warning and "no login" in warning
            assert ("can break locks" in warning) is actions
            assert [r.getMessage() for r in caplog.records] == [warning]  # logged as it binds
        finally:
            server.server_close()


def test_the_page_carries_the_token_only_when_actions_are_allowed(board: Dashboard) -> None:
    read_only = _server(board)
    acting = _server(board, allow_actions=True)
    other = _server(board, allow_actions=True)
    try:
        page = read_only.page()
        assert '<meta name="jobfence-actions" content="0">' in page
        assert '<meta name="jobfence-token" content="">' in page
        assert read_only.token not in page
        page = acting.page()
        assert '<meta name="jobfence-actions" content="1">' in page
        assert f'<meta name="jobfence-token" content="{acting.token}">' in page
        assert len(acting.token) >= 32 and acting.token != other.token  # new per process
        for name in ("{{", "http://", "https://"):  # nothing left to fill, nothing remote
            assert name not in page
    finally:
        for server in (read_only, acting, other):
            server.server_close()


def test_errors_are_masked() -> None:
    url = "redis://user:hunter2@db.example:6379/0"
    text = masked_error(BackendError(f"cannot reach {url}"), [url])
    assert "hunter2" not in text and "BackendError" in text and "db.example" in text


def test_bad_options_name_their_argument() -> None:
    with pytest.raises(ConfigurationError) as caught:
        DashboardConfig(urls=())
    assert caught.value.argument == "urls"
    with pytest.raises(ConfigurationError) as caught:
        DashboardConfig(urls=("memory://",), limit=0)
    assert caught.value.argument == "limit"
    with pytest.raises(ConfigurationError) as caught:
        DashboardConfig(urls=("memory://",), queues=("no spaces please",))
    with pytest.raises(ConfigurationError):
        Dashboard(DashboardConfig(urls=("nosuch://x",)))


def test_a_backend_without_a_part_shows_it_unsupported_without_connecting() -> None:
    board = Dashboard(
        DashboardConfig(
            urls=("amqp://guest:pw@127.0.0.1:1/%2F", "mysql://root@127.0.0.1:1/test"),
            queues=("q",),
        )
    )
    try:
        rabbit, mysql = board.targets
        assert rabbit.parts == {"queue"} and "queue" not in mysql.parts
        state = rabbit.state()
        assert state["locks"] == {"status": "unsupported"}
        assert state["inbox"] == {"status": "unsupported"}
        assert state["url"] == "amqp://guest:***@127.0.0.1:1/%2F"
        assert mysql._panel("queue", dict) == {"status": "unsupported"}
        with pytest.raises(ConfigurationError) as caught:
            rabbit.break_lock("x")
        assert "no locks" in str(caught.value)
        with pytest.raises(ConfigurationError):
            board.target(2)
        with pytest.raises(ConfigurationError):
            board.target(True)
    finally:
        board.close()
