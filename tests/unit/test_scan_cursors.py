"""SCAN cursors: 64-bit numbers that name a resume key (``server/scan_cursors.py``).

A full scan returns every key present for its whole length exactly once, with
COUNT 1 or 1000, while keys are added and deleted around it; a cursor works on
another connection of the bucket; the table is bounded, a tenant's flood of
scans evicts its own cursors first; cursors read as Redis's ``strtoul`` reads
them (``SCAN -1`` is past the end)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
import trio

from tenantkv import errors
from tenantkv.server import scan_cursors
from tenantkv.server.node import Node
from tenantkv.server.scan_cursors import END, ScanCursors, parse_cursor
from tests.unit.test_redis_session import RespPeer, resp_session
from tests.unit.test_session import node

__all__ = ["node"]


@pytest.mark.parametrize(
    ("arg", "want"),
    [
        (b"0", 0),
        (b"", 0),
        (b"42", 42),
        (b"+42", 42),
        (b"007", 7),
        (b"-1", 2**64 - 1),
        (b"18446744073709551615", 2**64 - 1),
        (b"-18446744073709551615", 1),
    ],
)
def test_cursors_read_as_strtoul(arg: bytes, want: int) -> None:
    assert parse_cursor(arg) == want


@pytest.mark.parametrize("arg", [b"18446744073709551616", b" 1", b"1 ", b"x", b"-", b"+", b"1.0"])
def test_malformed_cursors_are_invalid(arg: bytes) -> None:
    with pytest.raises(errors.BadValue, match="invalid cursor"):
        parse_cursor(arg)


def test_the_table_is_bounded_and_a_flood_evicts_its_own_first() -> None:
    t = ScanCursors(rng=random.Random(1))
    quiet = t.issue("quiet", b"k")
    for i in range(scan_cursors.MAX_PER_BUCKET * 3):
        t.issue("loud", b"%d" % i)
    assert t.resume("quiet", quiet) == b"k"
    assert t.statistics().entries == scan_cursors.MAX_PER_BUCKET + 1
    many = [t.issue(f"b{i}", b"x" * 250) for i in range(scan_cursors.SLOTS)]
    assert t.statistics().entries == scan_cursors.SLOTS
    assert t.resume(f"b{len(many) - 1}", many[-1]) == b"x" * 250
    with pytest.raises(errors.BadValue, match="invalid cursor"):
        t.resume("quiet", quiet)  # the oldest went first


def test_a_cursor_names_its_bucket_and_stays_below_the_end() -> None:
    t = ScanCursors()
    n = t.issue("a" * 100, b"k" * 250)
    assert 0 < n < END
    assert t.resume("a" * 100, n) == b"k" * 250
    with pytest.raises(errors.BadValue):
        t.resume("b", n)
    with pytest.raises(errors.BadValue):
        t.resume("a" * 100, n + 1)
    with pytest.raises(errors.BadValue):
        t.resume("a" * 100, 12345)


def test_another_process_reads_a_cursor_and_a_gone_one_is_swept(tmp_path: Path) -> None:
    """Each process writes its own file of slots and reads the others': a cursor
    issued by one worker resumes on another. A process's file goes with it."""
    directory = str(tmp_path / "scan-cursors")
    child = subprocess.Popen(["sleep", "30"])
    try:
        mine = ScanCursors(directory)
        theirs = ScanCursors(directory, pid=child.pid)
        n = theirs.issue("b", b"user:7")
        assert mine.resume("b", n) == b"user:7"
        m = mine.issue("b", b"user:9")
        assert theirs.resume("b", m) == b"user:9"
        theirs.issue("b", b"again")  # (a later slot: n still names its own)
        assert mine.resume("b", n) == b"user:7"
    finally:
        child.kill()
        child.wait()
    ScanCursors(directory, pid=os.getpid() + 1 if os.getpid() + 1 != child.pid else 1)
    assert not (tmp_path / "scan-cursors" / str(child.pid)).exists()
    with pytest.raises(errors.BadValue):
        ScanCursors(str(tmp_path / "other")).resume("b", n)


def test_a_reused_slot_forgets_its_cursor() -> None:
    t = ScanCursors()
    first = t.issue("b", b"k")
    for i in range(scan_cursors.MAX_PER_BUCKET):
        t.issue("b", b"%d" % i)
    with pytest.raises(errors.BadValue):
        t.resume("b", first)


async def scan_all(peer: RespPeer, count: int, between: object = None) -> list[bytes]:
    """Every key a full SCAN returns, in order, calling ``between(i)`` after page i."""
    out: list[bytes] = []
    cursor = b"0"
    page = 0
    while True:
        await peer.send((b"SCAN", cursor, b"COUNT", b"%d" % count))
        (got,) = await peer.replies(1)
        cursor, keys = _parse_scan(got)
        assert int(cursor) < 2**64
        out += keys
        if callable(between):
            await between(page)
        page += 1
        if cursor == b"0":
            return out


def _parse_scan(reply: bytes) -> tuple[bytes, list[bytes]]:
    parts = reply.split(b"\r\n")
    cursor = parts[2]
    n = int(parts[3][1:])
    return cursor, [parts[5 + 2 * i] for i in range(n)]


async def test_a_full_scan_returns_each_key_that_stayed_once(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        other = await resp_session(node, nursery)
        stay = [b"user:%06d" % i for i in range(0, 600, 2)]
        going = [b"user:%06d" % i for i in range(1, 600, 2)]
        await peer.send((b"MSET", *[x for k in stay + going for x in (k, b"v")]))
        assert await peer.replies(1) == [b"+OK\r\n"]

        async def churn(page: int) -> None:
            # Delete keys and add new ones on another connection as the scan goes.
            if page < len(going):
                await other.send((b"DEL", going[page]), (b"SET", b"new:%d" % page, b"v"))
                await other.replies(2)

        for count in (1, 7, 1000):
            got = await scan_all(peer, count, churn)
            assert len(got) == len(set(got)), "a key came twice"
            assert set(stay) <= set(got), "a key present throughout was skipped"
            going = [k for k in going if k in got]  # (re-used: what is left to delete)
        nursery.cancel_scope.cancel()


async def test_a_cursor_works_on_another_connection_and_minus_one_is_the_end(
    node: Node,
) -> None:
    async with trio.open_nursery() as nursery:
        a = await resp_session(node, nursery)
        b = await resp_session(node, nursery)
        await a.send((b"MSET", *[x for i in range(30) for x in (b"k%02d" % i, b"v")]))
        await a.replies(1)
        await a.send((b"SCAN", b"0", b"COUNT", b"10"))
        cursor, first = _parse_scan((await a.replies(1))[0])
        await b.send((b"SCAN", cursor, b"COUNT", b"10"))
        _, second = _parse_scan((await b.replies(1))[0])
        assert first + second == [b"k%02d" % i for i in range(20)]
        await a.send((b"SCAN", b"-1"), (b"SCAN", b"12345"), (b"SCAN", b"x"))
        got = await a.replies(3)
        assert got[0] == b"*2\r\n$1\r\n0\r\n*0\r\n"
        assert got[1].startswith(b"-ERR invalid cursor (unknown or expired")
        assert got[2] == b"-ERR invalid cursor\r\n"
        await a.send((b"KEYS", b"k0[1-"))
        assert (await a.replies(1))[0] == b"*1\r\n$3\r\nk01\r\n"
        nursery.cancel_scope.cancel()


def test_a_directory_it_cannot_write_leaves_the_cursors_in_the_process(tmp_path: Path) -> None:
    blocked = tmp_path / "data"
    blocked.mkdir()
    (blocked / scan_cursors.DIRECTORY).write_text("a file where the directory goes")
    table = scan_cursors.cursors(str(blocked))
    n = table.issue("b", b"k")
    assert scan_cursors.cursors(str(blocked)).resume("b", n) == b"k"
