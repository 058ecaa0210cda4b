"""Redis's range, bit, float and keyspace commands over memory streams, with the
cases of Redis 7.0's own tests (``tests/unit/type/string.tcl``, ``incr.tcl``,
``bitops.tcl``, ``keyspace.tcl``) and its error texts, and what each costs."""

from __future__ import annotations

import trio
import trio.testing

from tenantkv.server.node import Node
from tenantkv.server.redis_keyspace import OBJECT_HELP
from tests.unit.test_redis_session import RespPeer, resp_session
from tests.unit.test_session import node, units_used

__all__ = ["node"]

RNA1 = (
    b"CACCTTCCCAGGTAACAAACCAACCAACTTTCGATCTCTTGTAGATCTGTTCTCTAAACGAACTTTAAAATCTGTGTGGCTGTCACTCG"
    b"GCTGCATGCTTAGTGCACTCACGCAGTATAATTAATAACTAATTACTGTCGTTGACAGGACACGAGTAACTCGTCTATCTTCTGCAG"
    b"GCTGCTTACGGTTTCGTCCGTGTTGCAGCCGATCATCAGCACATCTAGGTTTCGTCCGGGTGTG"
)
RNA2 = (
    b"ATTAAAGGTTTATACCTTCCCAGGTAACAAACCAACCAACTTTCGATCTCTTGTAGATCTGTTCTCTAAACGAACTTTAAAATCTG"
    b"TGTGGCTGTCACTCGGCTGCATGCTTAGTGCACTCACGCAGTATAATTAATAACTAATTACTGTCGTTGACAGGACACGAGTAACT"
    b"CGTCTATCTTCTGCAGGCTGCTTACGGTTTCGTCCGTGTTGCAGCCGATCATCAGCACATCTAGGTTT"
)
RNALCS = (
    b"ACCTTCCCAGGTAACAAACCAACCAACTTTCGATCTCTTGTAGATCTGTTCTCTAAACGAACTTTAAAATCTGTGTGGCTGTCACTCG"
    b"GCTGCATGCTTAGTGCACTCACGCAGTATAATTAATAACTAATTACTGTCGTTGACAGGACACGAGTAACTCGTCTATCTTCTGCAG"
    b"GCTGCTTACGGTTTCGTCCGTGTTGCAGCCGATCATCAGCACATCTAGGTTT"
)


def bulk(v: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(v), v)


def err(text: str) -> bytes:
    return b"-ERR " + text.encode() + b"\r\n"


async def call(peer: RespPeer, *args: bytes | str | int) -> bytes:
    argv = tuple(a if isinstance(a, bytes) else str(a).encode() for a in args)
    await peer.send(argv)
    (got,) = await peer.replies(1)
    return got


async def check(node: Node, cases: list[tuple[tuple[bytes | str | int, ...], bytes]]) -> None:
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        for argv, want in cases:
            got = await call(peer, *argv)
            assert got == want, (argv, got, want)
        nursery.cancel_scope.cancel()


async def test_getrange_setrange_substr(node: Node) -> None:
    await check(
        node,
        [
            (("SET", "mykey", "Hello World"), b"+OK\r\n"),
            (("GETRANGE", "mykey", 0, 3), bulk(b"Hell")),
            (("GETRANGE", "mykey", 0, -1), bulk(b"Hello World")),
            (("GETRANGE", "mykey", -4, -1), bulk(b"orld")),
            (("GETRANGE", "mykey", 5, 3), bulk(b"")),
            (("GETRANGE", "mykey", 5, 5000), bulk(b" World")),
            (("SUBSTR", "mykey", -5000, 10000), bulk(b"Hello World")),
            (("GETRANGE", "mykey", 0, 4294967297), bulk(b"Hello World")),
            (("GETRANGE", "nokey", 0, 1), bulk(b"")),
            (("GETRANGE", "mykey", "a", 1), err("value is not an integer or out of range")),
            (("GETRANGE", "mykey", 0), err("wrong number of arguments for 'getrange' command")),
            (("SETRANGE", "mykey", 6, "Redis"), b":11\r\n"),
            (("GET", "mykey"), bulk(b"Hello Redis")),
            (("SETRANGE", "new", 1, "foo"), b":4\r\n"),
            (("GET", "new"), bulk(b"\0foo")),
            (("SETRANGE", "absent", 0, ""), b":0\r\n"),
            (("EXISTS", "absent"), b":0\r\n"),
            (("SETRANGE", "mykey", 0, ""), b":11\r\n"),
            (("SETRANGE", "mykey", -1, "x"), err("offset is out of range")),
            (
                ("SETRANGE", "K", 9223372036854775807, "A"),
                err("string exceeds maximum allowed size (proto-max-bulk-len)"),
            ),
            (
                ("SETRANGE", "K", 2147483647, "A"),
                err("string exceeds maximum allowed size (proto-max-bulk-len)"),
            ),
            (("SETRANGE", "K", 2147483647, ""), b":0\r\n"),  # nothing to write: no check
            (("SET", "n", 1234), b"+OK\r\n"),
            (("GETRANGE", "n", -3, -1), bulk(b"234")),
        ],
    )


async def test_incrbyfloat(node: Node) -> None:
    await check(
        node,
        [
            (("INCRBYFLOAT", "novar", 1), bulk(b"1")),
            (("INCRBYFLOAT", "novar", 0.25), bulk(b"1.25")),
            (("SET", "novar", 1.5), b"+OK\r\n"),
            (("INCRBYFLOAT", "novar", 1.5), bulk(b"3")),
            (("SET", "novar", 17179869184), b"+OK\r\n"),
            (("INCRBYFLOAT", "novar", 1.5), bulk(b"17179869185.5")),
            (("SET", "novar", 17179869184), b"+OK\r\n"),
            (("INCRBYFLOAT", "novar", 17179869184), bulk(b"34359738368")),
            (("SET", "x", "10.50"), b"+OK\r\n"),  # the examples of Redis's documentation
            (("INCRBYFLOAT", "x", "0.1"), bulk(b"10.6")),
            (("INCRBYFLOAT", "x", "-5"), bulk(b"5.6")),
            (("SET", "y", "5.0e3"), b"+OK\r\n"),
            (("INCRBYFLOAT", "y", "2.0e2"), bulk(b"5200")),
            (("SET", "s", "    11"), b"+OK\r\n"),
            (("INCRBYFLOAT", "s", 1.0), err("value is not a valid float")),
            (("SET", "s", "11 "), b"+OK\r\n"),
            (("INCRBYFLOAT", "s", 1.0), err("value is not a valid float")),
            (("INCRBYFLOAT", "novar", "abc"), err("value is not a valid float")),
            (("SET", "foo", 0), b"+OK\r\n"),
            (("INCRBYFLOAT", "foo", "+inf"), err("increment would produce NaN or Infinity")),
            (("SET", "foo", 1), b"+OK\r\n"),
            (("INCRBYFLOAT", "foo", -1.1), bulk(b"-0.1")),
            (("SET", "foo", 1), b"+OK\r\n"),
            (("SETRANGE", "foo", 2, 2), b":3\r\n"),
            (("INCRBYFLOAT", "foo", 1), err("value is not a valid float")),
            (("DEL", "foo"), b":1\r\n"),
            (("INCRBYFLOAT", "foo", repr(1 / 41)), bulk(b"0.02439024390243902")),
            (("INCRBYFLOAT", "foo", repr(-1 / 41)), bulk(b"0")),
            (("SET", "t", 5), b"+OK\r\n"),
            (("EXPIRE", "t", 100), b":1\r\n"),
            (("INCRBYFLOAT", "t", 1), bulk(b"6")),
            (("TTL", "t"), b":100\r\n"),  # the expiry is kept
        ],
    )


async def test_bits(node: Node) -> None:
    await check(
        node,
        [
            (("SETBIT", "b", 1, 1), b":0\r\n"),
            (("SETBIT", "b", 1, 1), b":1\r\n"),
            (("GET", "b"), bulk(b"\x40")),
            (("SETBIT", "b", 7, 1), b":0\r\n"),
            (("GETBIT", "b", 7), b":1\r\n"),
            (("GETBIT", "b", 1000), b":0\r\n"),
            (("GETBIT", "none", 0), b":0\r\n"),
            (("SETBIT", "b", -1, 1), err("bit offset is not an integer or out of range")),
            (("SETBIT", "b", 0, 2), err("bit is not an integer or out of range")),
            (("SETBIT", "b", 0, "x"), err("bit is not an integer or out of range")),
            (
                ("SETBIT", "b", 4294967296 * 8, 1),
                err("bit offset is not an integer or out of range"),
            ),
            (("GETBIT", "b", -1), err("bit offset is not an integer or out of range")),
            (("SET", "s", "foobar"), b"+OK\r\n"),
            (("BITCOUNT", "s"), b":26\r\n"),
            (("BITCOUNT", "s", 0, 0), b":4\r\n"),
            (("BITCOUNT", "s", 1, 1), b":6\r\n"),
            (("BITCOUNT", "s", 1, 1, "BYTE"), b":6\r\n"),
            (("BITCOUNT", "s", 5, 30, "BIT"), b":17\r\n"),
            (("BITCOUNT", "s", -1, -2), b":0\r\n"),
            (("BITCOUNT", "s", 0), err("syntax error")),
            (("BITCOUNT", "s", 0, 1, "bits"), err("syntax error")),
            (("BITCOUNT", "no", 0), b":0\r\n"),  # a missing key is 0 before the arguments
            (("SET", "p", b"\xff\xf0\x00"), b"+OK\r\n"),
            (("BITPOS", "p", 0), b":12\r\n"),
            (("SET", "p", b"\x00\xff\xf0"), b"+OK\r\n"),
            (("BITPOS", "p", 1, 0), b":8\r\n"),
            (("BITPOS", "p", 1, 2), b":16\r\n"),
            (("BITPOS", "p", 1, 2, -1, "BYTE"), b":16\r\n"),
            (("BITPOS", "p", 1, 7, 15, "BIT"), b":8\r\n"),
            (("SET", "p", b"\x00\x00\x00"), b"+OK\r\n"),
            (("BITPOS", "p", 1), b":-1\r\n"),
            (("SET", "p", b"\xff\xff\xff"), b"+OK\r\n"),
            (("BITPOS", "p", 0), b":24\r\n"),
            (("BITPOS", "p", 0, 0, -1), b":-1\r\n"),
            (("BITPOS", "none", 1), b":-1\r\n"),
            (("BITPOS", "none", 0), b":0\r\n"),
            (("BITPOS", "p", 2), err("The bit argument must be 1 or 0.")),
            (("SET", "a", "foobar"), b"+OK\r\n"),
            (("SET", "c", "abcdef"), b"+OK\r\n"),
            (("BITOP", "AND", "dest", "a", "c"), b":6\r\n"),
            (("GET", "dest"), bulk(b"`bc`ab")),
            (("BITOP", "OR", "dest", "a", "c", "none"), b":6\r\n"),
            (("GET", "dest"), bulk(b"goofev")),
            (
                ("BITOP", "NOT", "dest", "a", "c"),
                err("BITOP NOT must be called with a single source key."),
            ),
            (("BITOP", "NAND", "dest", "a"), err("syntax error")),
            (("BITOP", "XOR", "dest", "none"), b":0\r\n"),
            (("EXISTS", "dest"), b":0\r\n"),  # an empty result deletes the destination
            (("SET", "one", b"\x0f"), b"+OK\r\n"),
            (("BITOP", "NOT", "dest", "one"), b":1\r\n"),
            (("GET", "dest"), bulk(b"\xf0")),
        ],
    )


async def test_lcs(node: Node) -> None:
    await check(
        node,
        [
            (("SET", "virus1", RNA1), b"+OK\r\n"),
            (("SET", "virus2", RNA2), b"+OK\r\n"),
            (("LCS", "virus1", "virus2"), bulk(RNALCS)),
            (("LCS", "virus1", "virus2", "LEN"), b":%d\r\n" % len(RNALCS)),
            (
                ("LCS", "virus1", "virus2", "IDX", "WITHMATCHLEN", "MINMATCHLEN", 5),
                b"*4\r\n$7\r\nmatches\r\n*1\r\n*3\r\n*2\r\n:1\r\n:222\r\n*2\r\n:13\r\n:234\r\n"
                b":222\r\n$3\r\nlen\r\n:227\r\n",
            ),
            (
                ("LCS", "virus1", "virus2", "LEN", "IDX"),
                err("If you want both the length and indexes, please just use IDX."),
            ),
            (("LCS", "virus1", "virus2", "FOO"), err("syntax error")),
            (("LCS", "none", "none2"), bulk(b"")),
            (("SET", "big", b"x" * 1000), b"+OK\r\n"),
        ],
    )


async def test_lcs_indexes_as_redis(node: Node) -> None:
    """The IDX ranges of Redis's test, from the end backwards."""
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await call(peer, "SET", "v1", RNA1)
        await call(peer, "SET", "v2", RNA2)
        got = await call(peer, "LCS", "v1", "v2", "IDX")
        want = [
            ((238, 238), (239, 239)),
            ((236, 236), (238, 238)),
            ((229, 230), (236, 237)),
            ((224, 224), (235, 235)),
            ((1, 222), (13, 234)),
        ]
        body = b"".join(
            b"*2\r\n*2\r\n:%d\r\n:%d\r\n*2\r\n:%d\r\n:%d\r\n" % (*a, *b) for a, b in want
        )
        assert got == b"*4\r\n$7\r\nmatches\r\n*5\r\n" + body + b"$3\r\nlen\r\n:227\r\n"
        await call(peer, "SET", "big", b"x" * 1000)
        got = await call(peer, "LCS", "big", "big")
        assert got.startswith(b"-ERR Insufficient memory, transient memory for LCS exceeds"), got
        nursery.cancel_scope.cancel()


async def test_keyspace_commands(node: Node) -> None:
    await check(
        node,
        [
            (("SET", "src", "v"), b"+OK\r\n"),
            (("PEXPIREAT", "src", 4102444800000), b":1\r\n"),
            (("EXPIRETIME", "src"), b":4102444800\r\n"),
            (("PEXPIRETIME", "src"), b":4102444800000\r\n"),
            (("EXPIRETIME", "none"), b":-2\r\n"),
            (("COPY", "src", "dst"), b":1\r\n"),
            (("PEXPIRETIME", "dst"), b":4102444800000\r\n"),  # the expiry is copied
            (("COPY", "src", "dst"), b":0\r\n"),
            (("COPY", "src", "dst", "REPLACE"), b":1\r\n"),
            (("COPY", "src", "src"), err("source and destination objects are the same")),
            (("COPY", "none", "dst"), b":0\r\n"),
            (("COPY", "src", "d2", "DB", 1), err("DB index is out of range")),
            (("COPY", "src", "d2", "DB", 0), b":1\r\n"),
            (("COPY", "src", "d3", "FOO"), err("syntax error")),
            (("RENAME", "src", "moved"), b"+OK\r\n"),
            (("EXISTS", "src"), b":0\r\n"),
            (("GET", "moved"), bulk(b"v")),
            (("PEXPIRETIME", "moved"), b":4102444800000\r\n"),
            (("RENAME", "none", "x"), err("no such key")),
            (("RENAMENX", "none", "x"), err("no such key")),
            (("RENAME", "moved", "moved"), b"+OK\r\n"),
            (("RENAMENX", "moved", "moved"), b":0\r\n"),
            (("RENAMENX", "moved", "dst"), b":0\r\n"),
            (("RENAMENX", "moved", "fresh"), b":1\r\n"),
            (("PERSIST", "fresh"), b":1\r\n"),
            (("EXPIRETIME", "fresh"), b":-1\r\n"),
            (("TOUCH", "fresh", "dst", "none"), b":2\r\n"),
            (("SET", "i", "12345"), b"+OK\r\n"),
            (("OBJECT", "ENCODING", "i"), bulk(b"int")),
            (("OBJECT", "ENCODING", "fresh"), bulk(b"embstr")),
            (("SET", "r", "x" * 45), b"+OK\r\n"),
            (("OBJECT", "ENCODING", "r"), bulk(b"raw")),
            (("OBJECT", "ENCODING", "none"), b"$-1\r\n"),
            (("OBJECT", "REFCOUNT", "r"), b":1\r\n"),
            (("OBJECT", "NOPE", "r"), err("unknown subcommand 'NOPE'. Try OBJECT HELP.")),
            (
                ("OBJECT", "ENCODING"),
                err("wrong number of arguments for 'object|encoding' command"),
            ),
            (
                ("OBJECT", "HELP"),
                b"*15\r\n" + b"".join(b"+%b\r\n" % line.encode() for line in OBJECT_HELP),
            ),
        ],
    )


async def test_randomkey(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        assert await call(peer, "RANDOMKEY") == b"$-1\r\n"
        for i in range(20):
            await call(peer, "SET", f"k{i:02}", "v")
        seen = {await call(peer, "RANDOMKEY") for _ in range(40)}
        assert seen <= {bulk(b"k%02d" % i) for i in range(20)}
        assert len(seen) > 3
        nursery.cancel_scope.cancel()


async def test_other_families_answer_unknown_command(node: Node) -> None:
    """One rule for what tenantkv does not run: Redis's own unknown-command answer."""
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        for name in ("lpush", "hset", "eval", "dump", "restore", "module", "flushall", "xadd"):
            got = await call(peer, name.upper(), "a", "b")
            assert got.startswith(b"-ERR unknown command '%b'" % name.upper().encode()), got
        nursery.cancel_scope.cancel()


async def test_costs(node: Node, mock_clock: trio.testing.MockClock) -> None:
    """Reads cost the read units of the record read; a SETRANGE the write units of
    the record it wrote plus the read units of the value it read; RENAME the record
    written plus the one read; refused before it runs at one floor."""
    cfg = node.config
    rd = -(-(3 + 20 + 100_000) // cfg.read_unit_size)
    wr = -(-(3 + 20 + 100_000) // cfg.write_unit_size) * cfg.write_weight
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await call(peer, "SET", "big", b"x" * 100_000)
        before = units_used(node)
        assert await call(peer, "GETRANGE", "big", 0, 0) == bulk(b"x")
        assert units_used(node) - before == rd
        before = units_used(node)
        assert await call(peer, "SETRANGE", "big", 0, "y") == b":100000\r\n"
        assert units_used(node) - before == wr + -(-100_000 // cfg.read_unit_size)
        before = units_used(node)
        assert await call(peer, "SETRANGE", "big", 10**12, "y") == err(
            "string exceeds maximum allowed size (proto-max-bulk-len)"
        )
        assert units_used(node) - before == cfg.min_op_units
        nursery.cancel_scope.cancel()


async def test_bitfield(node: Node) -> None:
    """The cases of Redis's ``tests/unit/bitfield.tcl`` and its documentation."""
    await check(
        node,
        [
            (("BITFIELD", "bits", "SET", "i8", 0, -100), b"*1\r\n:0\r\n"),
            (("BITFIELD", "bits", "GET", "i8", 0), b"*1\r\n:-100\r\n"),
            (("BITFIELD", "bits", "SET", "u8", 0, 255), b"*1\r\n:156\r\n"),
            (("BITFIELD", "bits", "GET", "u8", 0), b"*1\r\n:255\r\n"),
            (("DEL", "bits"), b":1\r\n"),
            (
                ("BITFIELD", "bits", "SET", "u8", "#0", 65, "SET", "u8", "#1", 66),
                b"*2\r\n:0\r\n:0\r\n",
            ),
            (("GET", "bits"), bulk(b"AB")),
            (
                (
                    "BITFIELD",
                    "bits",
                    "INCRBY",
                    "u2",
                    100,
                    1,
                    "OVERFLOW",
                    "SAT",
                    "INCRBY",
                    "u2",
                    102,
                    1,
                ),
                b"*2\r\n:1\r\n:1\r\n",
            ),
            (
                (
                    "BITFIELD",
                    "bits",
                    "INCRBY",
                    "u2",
                    100,
                    1,
                    "OVERFLOW",
                    "SAT",
                    "INCRBY",
                    "u2",
                    102,
                    1,
                ),
                b"*2\r\n:2\r\n:2\r\n",
            ),
            (
                (
                    "BITFIELD",
                    "bits",
                    "INCRBY",
                    "u2",
                    100,
                    1,
                    "OVERFLOW",
                    "SAT",
                    "INCRBY",
                    "u2",
                    102,
                    1,
                ),
                b"*2\r\n:3\r\n:3\r\n",
            ),
            (
                (
                    "BITFIELD",
                    "bits",
                    "INCRBY",
                    "u2",
                    100,
                    1,
                    "OVERFLOW",
                    "SAT",
                    "INCRBY",
                    "u2",
                    102,
                    1,
                ),
                b"*2\r\n:0\r\n:3\r\n",
            ),
            (("BITFIELD", "bits", "OVERFLOW", "FAIL", "INCRBY", "u2", 102, 1), b"*1\r\n$-1\r\n"),
            (("BITFIELD", "bits", "SET", "i8", 0, 128), b"*1\r\n:65\r\n"),
            (("BITFIELD", "bits", "GET", "i8", 0), b"*1\r\n:-128\r\n"),
            (("BITFIELD", "bits", "OVERFLOW", "SAT", "SET", "i8", 0, 128), b"*1\r\n:-128\r\n"),
            (("BITFIELD", "bits", "GET", "i8", 0), b"*1\r\n:127\r\n"),
            (
                ("BITFIELD", "bits", "SET", "u64", 0, 1),
                err(
                    "Invalid bitfield type. Use something like i16 u8. Note that u64 is not "
                    "supported but i64 is."
                ),
            ),
            (("BITFIELD", "bits", "OVERFLOW", "FOO"), err("Invalid OVERFLOW type specified")),
            (("BITFIELD", "bits", "GET", "u8"), err("syntax error")),
            (
                ("BITFIELD", "bits", "GET", "u8", -1),
                err("bit offset is not an integer or out of range"),
            ),
            (
                ("BITFIELD", "bits", "SET", "u8", 0, "x"),
                err("value is not an integer or out of range"),
            ),
            (("BITFIELD_RO", "bits", "GET", "u8", 0), b"*1\r\n:127\r\n"),
            (
                ("BITFIELD_RO", "bits", "SET", "u8", 0, 1),
                err("BITFIELD_RO only supports the GET subcommand"),
            ),
            (("BITFIELD", "absent", "GET", "u8", 0), b"*1\r\n:0\r\n"),
            (("EXISTS", "absent"), b":0\r\n"),  # GET alone creates nothing
            (("BITFIELD", "made", "OVERFLOW", "FAIL", "INCRBY", "u2", 8, 9), b"*1\r\n$-1\r\n"),
            (("STRLEN", "made"), b":2\r\n"),  # grown before it ran, as Redis does
            (("BITFIELD", "bits"), b"*0\r\n"),
        ],
    )


def test_docs_name_every_command_and_every_family() -> None:
    """docs/redis.md lists each supported command, and each family not supported
    with its reason; no name is both."""
    from pathlib import Path

    from tenantkv.server.redis_commands import REDIS_COMMANDS
    from tenantkv.server.redis_docs import NOT_SUPPORTED

    text = (Path(__file__).resolve().parents[2] / "docs" / "redis.md").read_text()
    for name in REDIS_COMMANDS:
        assert f"`{name.upper()}" in text, name
    for family, (why, names) in NOT_SUPPORTED.items():
        assert why in text, family
        assert not names & set(REDIS_COMMANDS), family
