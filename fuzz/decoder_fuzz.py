"""Decoder-only fuzz harness for long campaigns: ``tenantkv.protocol`` without a server.

    python fuzz/decoder_fuzz.py --minutes 30                      # built-in mutation loop
    python fuzz/decoder_fuzz.py --atheris -max_total_time=1800    # atheris + libFuzzer flags

The target feeds arbitrary bytes, split into arbitrary chunks, to
:class:`tenantkv.protocol.RequestDecoder` (the server's side, with a small
frame bound so the bound is reached often) and to
:class:`~tenantkv.protocol.ResponseDecoder` (the client's), and checks:

- the request decoder raises nothing but ``ProtocolError`` or ``FrameTooLarge``
  (and nothing more once it has raised: the connection is closed then), and
  everything it yields is a well-formed ``Request``;
- the response decoder raises nothing but ``ConnectionClosed``;
- no decoder holds more than its frame bound of unconsumed input.

With ``--atheris`` (``pip install atheris``) it runs under libFuzzer's
coverage guidance; the arguments after it are libFuzzer's. Without it, a
seeded loop mutates a corpus of valid frames (bit flips, truncation,
splicing, length-field edits, huge declared lengths, deep nesting) and random
bytes; a failing input is written to ``--crash-dir`` and replayed with
``--replay FILE``. Exit status 1 if any input failed.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack

from tenantkv import errors, protocol

#: Frame bound of the fuzzed request decoder (the server's is ~20 MiB).
FRAME_BOUND = 4096
#: Failing inputs kept per distinct failure.
MAX_SAVED_PER_FAILURE = 5


def _containers(obj: object) -> int:
    """Arrays and maps in a decoded value (iteratively: it may nest deeply)."""
    n, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, list):
            n += 1
            stack.extend(o)
        elif isinstance(o, dict):
            n += 1
            stack.extend(o.values())
    return n


def check_one(data: bytes) -> None:
    """The target: raises AssertionError (or anything unexpected) on a bug."""
    if not data:
        return
    # The first byte picks how the input is cut into chunks, as TCP might.
    step = data[0] % 64 + 1
    body = data[1:]
    chunks = [body[i : i + step] for i in range(0, len(body), step)] or [b""]

    # The second byte picks the server's state: before hello (the small bound) or after.
    dec = protocol.RequestDecoder(FRAME_BOUND)
    if data[0] & 0x80:
        dec.frame_limit = protocol.MAX_HELLO_FRAME_BYTES // 4
    try:
        for chunk in chunks:
            dec.feed(chunk)
            for req in dec:
                assert type(req) is tuple and len(req) == 3  # (msgid, method, params)
                msgid, method, params = req
                assert type(msgid) is int and 0 <= msgid < 2**32
                assert type(method) is str and type(params) is dict
                assert _containers(params) < protocol.MAX_FRAME_CONTAINERS
            # bytes of an incomplete frame: never more than the bound in force
            assert 0 <= dec.buffered <= dec.frame_limit, dec.buffered
            if not dec.buffered:
                dec.release_if_idle()
                assert not dec.unpackers  # idle: no parse stack held
    except (errors.ProtocolError, errors.FrameTooLarge):
        pass

    rdec = protocol.ResponseDecoder(FRAME_BOUND)
    try:
        for chunk in chunks:
            rdec.feed(chunk)
            for resp in rdec:
                assert isinstance(resp, protocol.Response)
    except errors.ConnectionClosed:
        pass


# -- the built-in mutation loop ---------------------------------------------------------


def corpus() -> list[bytes]:
    reqs = [
        [0, 1, "hello", {"user": "u", "password": "p", "bucket": "b"}],
        [0, 2, "set", {"key": b"k", "value": b"v" * 40, "ttl": 10, "flags": 3}],
        [0, 3, "get", {"key": "k"}],
        [0, 4, "mget", {"keys": [b"a", b"b", "c"]}],
        [0, 5, "scan", {"prefix": b"p", "limit": 10, "after": None}],
        [0, 6, "create_user", {"name": "x", "password": "y", "roles": {"b": "read"}}],
        [0, 7, "ping", None],
    ]
    out = [msgpack.packb(r) for r in reqs]
    out.append(b"".join(out))
    out.append(msgpack.packb([1, 9, None, {"value": b"x", "cas": 1}]))
    out.append(msgpack.packb([1, None, {"code": 4, "codeName": "ProtocolError"}, None]))
    return out


HEADERS = [
    b"\xc4\xff",
    b"\xc5\xff\xff",
    b"\xc6\xff\xff\xff\xff",
    b"\xd9\xff",
    b"\xda\xff\xff",
    b"\xdb\xff\xff\xff\xff",
    b"\xdc\xff\xff",
    b"\xdd\xff\xff\xff\xff",
    b"\xde\xff\xff",
    b"\xdf\xff\xff\xff\xff",
    b"\xc7\xff\x01",
    b"\xc9\xff\xff\xff\xff\x01",
    b"\xd4\x01\x00",
    b"\xc1",  # never used
]


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(8)
        if op == 0 and data:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 1 and data:  # truncate
            del data[rng.randrange(len(data) + 1) :]
        elif op == 2:  # splice another seed in
            other = rng.choice(seeds)
            at = rng.randrange(len(data) + 1)
            data[at:at] = other[rng.randrange(len(other) + 1) :]
        elif op == 3:  # a huge declared length
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.choice(HEADERS)
        elif op == 4:  # deep nesting
            depth = rng.choice((10, 100, 1000, 10_000))
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.choice((b"\x91", b"\x81\xa1k")) * depth + b"\xc0"
        elif op == 5 and len(data) > 2:  # edit a length field
            at = rng.randrange(len(data) - 1)
            data[at : at + 2] = struct.pack(">H", rng.choice((0, 1, 0x7FFF, 0xFFFF)))
        elif op == 6:  # random bytes
            data += os.urandom(rng.randint(1, 64))
        else:  # duplicate a slice
            if data:
                i = rng.randrange(len(data))
                data[i:i] = data[i : i + rng.randint(1, 32)]
    return bytes([rng.randrange(256)]) + bytes(data)


def run_loop(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    seeds = corpus()
    crash_dir = Path(args.crash_dir)
    deadline = time.monotonic() + args.minutes * 60
    runs = failures = 0
    #: failing inputs per distinct failure (exception type and innermost frame)
    seen: dict[str, int] = {}
    next_report = time.monotonic() + 10
    while time.monotonic() < deadline and (args.runs == 0 or runs < args.runs):
        data = mutate(rng, seeds) if rng.random() < 0.9 else os.urandom(rng.randint(0, 512))
        runs += 1
        try:
            check_one(data)
        except Exception as exc:
            failures += 1
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            signature = f"{type(exc).__name__} at {Path(tb.filename).name}:{tb.lineno}"
            seen[signature] = seen.get(signature, 0) + 1
            if seen[signature] <= MAX_SAVED_PER_FAILURE:
                crash_dir.mkdir(parents=True, exist_ok=True)
                path = crash_dir / f"crash-{args.seed}-{runs}.bin"
                path.write_bytes(data)
                if seen[signature] == 1:
                    print(f"NEW FAILURE {signature}; input {path}:", file=sys.stderr)
                    traceback.print_exc(limit=-3)
        if time.monotonic() >= next_report:
            print(f"{runs} inputs, {failures} failures", file=sys.stderr)
            next_report += 10
    for signature, n in seen.items():
        print(f"{n} inputs failed with {signature}")
    print(f"done: {runs} inputs, {failures} failures (seed {args.seed})")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--atheris"]:
        try:
            import atheris  # type: ignore[import-not-found]
        except ImportError:
            print("atheris is not installed: pip install atheris", file=sys.stderr)
            return 2
        atheris.Setup([sys.argv[0], *argv[1:]], check_one)
        atheris.Fuzz()
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=1.0, help="how long to run [1]")
    p.add_argument("--runs", type=int, default=0, help="stop after this many inputs (0 = time)")
    p.add_argument("--seed", type=int, default=int(time.time()), help="random seed [now]")
    p.add_argument("--crash-dir", default="fuzz/crashes", help="where failing inputs go")
    p.add_argument("--replay", metavar="FILE", help="run one saved input and show the error")
    args = p.parse_args(argv)
    if args.replay:
        check_one(Path(args.replay).read_bytes())
        print("no failure")
        return 0
    return run_loop(args)


if __name__ == "__main__":
    sys.exit(main())
