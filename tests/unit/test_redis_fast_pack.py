"""The request packing of jobfence's own Redis clients: byte for byte what redis-py's own
pure-Python packer writes, and redis-py's packer itself for what the fast path leaves out."""

from __future__ import annotations

from typing import Any

import pytest
from redis.connection import Connection, PythonRespSerializer
from redis.exceptions import DataError

from jobfence._core.url import parse_url
from jobfence.backends.redis.client import _FastSerializer, connect_redis, fast_pack

CASES: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 2, "ns:lock:{item:7}", "tbl:k:é", b"\x80\x04r", 30000, -5, "", 0),
    ("GET", "key"),
    ("SET", "k", b"v" * 6000),
    ("SET", "k", b"v" * 6001),  # longer than the cutoff: redis-py sends it uncopied
    ("SET", "k", "ü" * 3001),  # its encoding is longer than the cutoff
    ("SCRIPT LOAD", "return 1"),  # a two-word command name, split by redis-py
    ("SET", "k", 1.5),  # a float: redis-py's own form
    ("SET", "k", bytearray(b"x")),
    ("SET", "k", memoryview(b"x")),
]


def _redis_py(args: tuple[Any, ...]) -> bytes:
    packer = PythonRespSerializer(6000, Connection().encoder.encode)
    return b"".join(bytes(part) for part in packer.pack(*args))


@pytest.mark.parametrize("args", CASES)
def test_packed_as_redis_py_packs(args: tuple[Any, ...]) -> None:
    packer = _FastSerializer(6000, Connection().encoder)
    assert b"".join(bytes(part) for part in packer.pack(*args)) == _redis_py(args)


def test_fast_path_taken_only_where_it_writes_the_same() -> None:
    assert fast_pack(CASES[0], True, 6000) == _redis_py(CASES[0])
    assert fast_pack(("SET", "k", b"v" * 6001), True, 6000) is None
    assert fast_pack(("SCRIPT LOAD", "x"), True, 6000) is None
    assert fast_pack(("SET", "k", 1.5), True, 6000) is None
    assert fast_pack(("SET", "k", True), True, 6000) is None
    assert fast_pack(("GET", "k"), False, 6000) is None  # a client with another encoding


def test_a_bool_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(DataError):
        _FastSerializer(6000, Connection().encoder).pack("SET", "k", True)


def test_another_encoding_is_packed_by_redis_py() -> None:
    encoder = Connection(encoding="latin-1").encoder
    packed = b"".join(_FastSerializer(6000, encoder).pack("SET", "k", "é"))
    assert packed.endswith(b"$1\r\n\xe9\r\n")


def test_clients_jobfence_opens_pack_fast() -> None:
    client = connect_redis(parse_url("redis://127.0.0.1:1/0"), {}, what="test")
    try:
        connection = client.connection_pool.make_connection()
        assert isinstance(connection._command_packer, _FastSerializer) or (
            type(connection._command_packer).__name__ == "HiredisRespSerializer"
        )
    finally:
        client.close()


@pytest.mark.parametrize("args", CASES)
def test_asyncio_connections_pack_as_redis_py_packs(args: tuple[Any, ...]) -> None:
    from jobfence.backends.redis import client_async

    client = client_async.connect_redis(parse_url("redis://127.0.0.1:1/0"), {}, what="test")
    connection = client.connection_pool.make_connection()
    assert isinstance(connection, client_async._Watched)
    packed = b"".join(bytes(part) for part in connection.pack_command(*args))
    assert packed == _redis_py(args)
