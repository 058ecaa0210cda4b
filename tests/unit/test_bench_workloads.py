"""YCSB workloads for the load generator: key distributions, plans, rings and reply counting.

Everything is seeded, so each check is deterministic; the bounds are several
standard deviations wide so that they test the distribution, not the seed.
"""

from __future__ import annotations

import ctypes
import random
import statistics
from collections import Counter

import msgpack
import pytest

from bench import loadgen, workloads
from bench.loadgen import (
    WORKLOAD,
    BenchError,
    LoadSpec,
    MsgpackRpcParser,
    RedisCodec,
    RespParser,
    Target,
    TenantKVCodec,
)
from bench.workloads import WORKLOADS, Step

DRAWS = 100_000


def _java_fnvhash64(val: int) -> int:
    """YCSB's Utils.fnvhash64 in Java's signed 64-bit arithmetic."""
    h = ctypes.c_int64(workloads.FNV_OFFSET_BASIS_64 - (1 << 64)).value
    for _ in range(8):
        h = ctypes.c_int64((h ^ (val & 0xFF)) * workloads.FNV_PRIME_64).value
        val >>= 8
    return abs(h)


def test_fnv_hash_is_ycsbs() -> None:
    for v in [0, 1, 2, 255, 256, 12345, 2**33 + 7, workloads.SCRAMBLED_ITEM_COUNT]:
        assert workloads.fnv_hash64(v) == _java_fnvhash64(v)
        assert 0 <= workloads.fnv_hash64(v) < 2**63


def test_zipfian_matches_theory() -> None:
    n = 1000
    z = workloads.Zipfian(0, n - 1, random.Random(1))
    counts = Counter(z.next() for _ in range(DRAWS))
    assert min(counts) >= 0 and max(counts) < n
    zetan = workloads.zeta(0, n, 0.99)
    # items 0 and 1 are exact in Gray et al.'s method; the rest come from a
    # continuous approximation (item 2 gets ~18 % too much, later ones ~2 %)
    for item, rel in ((0, 0.05), (1, 0.05), (9, 0.1), (10, 0.1), (50, 0.25)):
        expected = 1 / ((item + 1) ** 0.99 * zetan)
        assert counts[item] / DRAWS == pytest.approx(expected, rel=rel), item
    head = sum(counts[i] for i in range(100)) / DRAWS
    assert head == pytest.approx(workloads.zeta(0, 100, 0.99) / zetan, rel=0.03)
    assert counts.most_common(1)[0][0] == 0


def test_scrambled_zipfian_hottest_key_near_theory() -> None:
    n = 1000
    z = workloads.ScrambledZipfian(0, n - 1, random.Random(2))
    counts = Counter(z.next() for _ in range(DRAWS))
    assert min(counts) >= 0 and max(counts) < n
    hot, hits = counts.most_common(1)[0]
    # item 0 of the 10^10-item zipfian is hashed onto one key: 1/zeta = 3.78 %,
    # plus the few other items that land on the same key (~0.1 %)
    assert hot == workloads.fnv_hash64(0) % n
    assert 1 / workloads.SCRAMBLED_ZETAN - 0.002 < hits / DRAWS < 0.046
    # scattered: the ten hottest keys are not the ten lowest
    top10 = {k for k, _ in counts.most_common(10)}
    assert top10 != set(range(10))
    # skewed, though flatter than a plain zipfian over 1000 keys (70 %): the
    # hottest 10 % of keys take ~30 % of the draws, a uniform choice 10 %
    top100 = sum(c for _, c in counts.most_common(100)) / DRAWS
    assert 0.25 < top100 < 0.35


def test_uniform_spread() -> None:
    n = 1000
    u = workloads.Uniform(0, n - 1, random.Random(3))
    counts = Counter(u.next() for _ in range(DRAWS))
    assert set(counts) == set(range(n))
    mean = DRAWS / n
    assert 0.6 * mean < min(counts.values()) and max(counts.values()) < 1.4 * mean


def _last_before(steps: list[Step], records: int) -> list[tuple[Step, int]]:
    """Each step with the newest key inserted before it."""
    last = records - 1
    out = []
    for s in steps:
        out.append((s, last))
        if s.kind == "insert":
            last = s.key
    return out


def test_latest_favours_recent_inserts() -> None:
    records = 1000
    steps = workloads.plan("D", 10_000, records, seed=4)
    ages = [last - s.key for s, last in _last_before(steps, records) if s.kind == "read"]
    assert min(ages) >= 0  # never a key the plan has not inserted yet
    newest = sum(a == 0 for a in ages) / len(ages)
    recent = sum(a < 10 for a in ages) / len(ages)
    # zipfian over recency: P(age 0) = 1/zeta(~1250) ~ 13 %, P(age < 10) ~ 38 %
    assert 0.10 < newest < 0.17
    assert 0.30 < recent < 0.45
    assert statistics.median(ages) < 40
    # the same reads under uniform keys: no pull towards the newest
    uni = workloads.plan("D", 10_000, records, "uniform", seed=4)
    uni_ages = [last - s.key for s, last in _last_before(uni, records) if s.kind == "read"]
    assert sum(a < 10 for a in uni_ages) / len(uni_ages) < 0.02


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_op_mix_matches_the_workload(name: str) -> None:
    w = WORKLOADS[name]
    n = 10_000
    steps = workloads.plan(name, n, 1000)
    assert len(steps) == n
    ops = workloads.ycsb_op_counts(steps)
    total = sum(ops.values())
    for op, p in w.mix:
        assert abs(ops[op] / total - p) < 0.01, (op, ops)
    assert set(ops) == {op for op, _ in w.mix}
    assert total * w.requests_per_op == pytest.approx(n, rel=0.001)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_keys_in_range_and_inserts_sequential(name: str) -> None:
    records = 500
    steps = workloads.plan(name, 5000, records, seed=5)
    inserts = [s.key for s in steps if s.kind == "insert"]
    assert inserts == list(range(records, records + len(inserts)))
    for s, last in _last_before(steps, records):
        if s.kind != "insert":
            assert 0 <= s.key <= last, s  # only keys inserted before
    uniform = workloads.plan(name, 5000, records, "uniform", seed=5)
    assert all(s.key < records for s in uniform if s.kind != "insert")  # as in YCSB


def test_scan_lengths() -> None:
    steps = workloads.plan("E", 10_000, 1000)
    lengths = [s.count for s in steps if s.op == "scan"]
    assert all(s.kind == "scan" for s in steps if s.op == "scan")
    assert min(lengths) == 1 and max(lengths) == workloads.MAX_SCAN_LENGTH
    assert statistics.mean(lengths) == pytest.approx(50.5, abs=1.5)
    assert all(s.count == 0 for s in steps if s.op != "scan")


def test_read_modify_write_pairs() -> None:
    steps = workloads.plan("F", 9_999, 1000)
    i = pairs = 0
    while i < len(steps):
        s = steps[i]
        if s.kind == "rmw":
            nxt = steps[i + 1]
            assert (s.op, nxt.op, nxt.kind) == ("get", "set", "rmw")
            assert nxt.key == s.key
            pairs += 1
            i += 2
        else:
            assert (s.op, s.kind) == ("get", "read")
            i += 1
    assert pairs == 3333


def test_plan_is_deterministic() -> None:
    a = workloads.plan("A", 2000, 1000, seed=7)
    assert a == workloads.plan("A", 2000, 1000, seed=7)
    assert a != workloads.plan("A", 2000, 1000, seed=8)
    assert a != workloads.plan("A", 2000, 1000, "uniform", seed=7)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_op_counts_fill_exactly(name: str) -> None:
    w = WORKLOADS[name]
    for n in range(1, 60):
        counts = workloads.op_counts(w, n)
        assert sum(workloads.REQUESTS_PER[op] * c for op, c in counts.items()) == n
        assert len(workloads.plan(name, n, 10)) == n


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="records"):
        workloads.plan("A", 10, 1)
    with pytest.raises(ValueError, match="distribution"):
        workloads.plan("A", 10, 10, "pareto")


# -- the load generator side -------------------------------------------------------------


def _spec(workload: str, **kw: object) -> LoadSpec:
    base: dict[str, object] = {
        "op": WORKLOAD,
        "conns": 4,
        "depth": 1,
        "value": b"v" * 100,
        "keys": 1000,
        "seconds": 1.0,
        "warmup": 0.0,
        "key_prefix": b"y:E:",
        "workload": workload,
    }
    base.update(kw)
    return LoadSpec(**base)  # type: ignore[arg-type]


@pytest.fixture
def small_ring(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(loadgen, "WORKLOAD_RING", 4096)
    return 4096


def test_tenantkv_ring_replays_the_plan(small_ring: int) -> None:
    spec = _spec("E")
    blob, offs, ring = loadgen.build_ring(TenantKVCodec("u", "p", "b"), spec)
    assert ring == small_ring
    assert len(offs) == 2 * ring + 1 and blob[: offs[ring]] == blob[offs[ring] :]
    steps = workloads.plan("E", ring, spec.keys, spec.distribution, spec.seed)
    up = msgpack.Unpacker(raw=False)
    up.feed(blob[: offs[ring]])
    reqs = list(up)
    assert len(reqs) == ring
    for i, (req, step) in enumerate(zip(reqs, steps, strict=True)):
        assert req[0] == 0 and req[1] == i and req[2] == step.op
        key = loadgen.key_name(spec.key_prefix, step.key)
        if step.op == "scan":
            assert req[3] == {"start": key, "end": b"y:E;", "limit": step.count}
        else:
            assert req[3] == {"key": key, "value": spec.value}  # E's other op: insert


def test_redis_cannot_scan(small_ring: int) -> None:
    with pytest.raises(BenchError, match="scans"):
        loadgen.build_ring(RedisCodec(), _spec("E"))
    with pytest.raises(ValueError, match="scans"):
        loadgen.run_loads([(Target("127.0.0.1", 9, RedisCodec()), _spec("E"))])
    blob, offs, _ = loadgen.build_ring(RedisCodec(), _spec("F"))
    assert blob[: offs[2]].count(b"GET") + blob[: offs[2]].count(b"SET") == 2


def test_workload_spec_checks() -> None:
    target = Target("127.0.0.1", 9, TenantKVCodec("u", "p", "b"))
    with pytest.raises(ValueError, match="workload"):
        loadgen.run_loads([(target, _spec("A", op="get"))])
    with pytest.raises(ValueError, match="workload"):
        loadgen.run_loads([(target, _spec("Z"))])
    with pytest.raises(ValueError, match="distribution"):
        loadgen.run_loads([(target, _spec("A", distribution="pareto"))])


def test_existing_rings_unchanged() -> None:
    codec = TenantKVCodec("u", "p", "b")
    spec = LoadSpec(op=loadgen.MIXED, conns=1, depth=1, value=b"x", keys=200, seconds=1,
                    warmup=0, set_fraction=0.25)  # fmt: skip
    blob, _, ring = loadgen.build_ring(codec, spec)
    assert ring == 200
    expected = b"".join(
        codec.encode(loadgen.mixed_op(i, 0.25), loadgen.key_name(b"bench:", i), b"x", i)
        for i in range(200)
    )
    assert blob == expected * 2


def _chunks(data: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        k = rng.randint(1, 40)
        out.append(data[i : i + k])
        i += k
    return out


def _count(parser: MsgpackRpcParser | RespParser, chunks: list[bytes]) -> tuple[int, int]:
    ok = err = 0
    for c in chunks:
        o, e = parser.feed(c)
        ok, err = ok + o, err + e
    return ok, err


def test_msgpack_parser_counts_mixed_replies() -> None:
    def reply(i: int, error: object, result: object) -> bytes:
        return msgpack.packb([1, i, error, result], use_bin_type=True)

    hit = {"value": b"v" * 100, "cas": 5, "flags": 0, "expiry_ms": 0}
    page = {"items": [[b"k%d" % j, b"v" * 100, j, 0, 0] for j in range(50)], "cursor": b"k49"}
    stream = b"".join(
        [
            reply(0, None, hit),  # GET hit
            reply(1, None, None),  # GET miss: ok, not an error
            reply(2, None, {"cas": 6}),  # SET
            reply(3, None, page),  # scan page
            reply(4, None, {"items": [], "cursor": None}),  # empty scan
            reply(5, {"code": 25, "codeName": "Throttled"}, None),
        ]
        * 20
    )
    rng = random.Random(9)
    assert _count(MsgpackRpcParser(), [stream]) == (100, 20)
    assert _count(MsgpackRpcParser(), _chunks(stream, rng)) == (100, 20)
    assert _count(MsgpackRpcParser(), [stream[i : i + 1] for i in range(len(stream))]) == (100, 20)


def test_resp_parser_counts_mixed_replies() -> None:
    value = b"v" * 100
    parser_for_workload = RedisCodec().parser(WORKLOAD, value)
    hit = b"$100\r\n" + value + b"\r\n"
    rng = random.Random(10)
    pieces = [hit] * 30 + [b"+OK\r\n"] * 10 + [b"$-1\r\n"] * 5 + [b"-ERR oops\r\n"] * 2
    rng.shuffle(pieces)
    stream = b"".join(pieces * 10)
    assert _count(parser_for_workload, [stream]) == (450, 20)
    for _ in range(5):
        p = RedisCodec().parser(WORKLOAD, value)
        assert _count(p, _chunks(stream, rng)) == (450, 20)
    p = RedisCodec().parser(WORKLOAD, value)
    assert _count(p, [stream[i : i + 1] for i in range(len(stream))]) == (450, 20)
    assert p.error_sample == "-ERR oops"


def test_random_keys_draw_over_the_keyspace_as_redis_benchmark_r_does() -> None:
    """``random_keys`` (bench resp's MessagePack twin of ``redis-benchmark -r``):
    keys drawn over the whole keyspace, seeded, where the default ring goes in
    order."""

    def keys(random_keys: bool = False) -> list[bytes]:
        spec = LoadSpec(
            op="get",
            conns=1,
            depth=64,
            value=b"v",
            keys=1000,
            seconds=1,
            warmup=0,
            random_keys=random_keys,
        )
        blob, offs, ring = loadgen.build_ring(TenantKVCodec("u", "p", "b"), spec)
        up = msgpack.Unpacker(raw=False)
        up.feed(blob[: offs[ring]])
        return [req[3]["key"] for req in up]

    ordered, drawn = keys(), keys(random_keys=True)
    assert ordered == [loadgen.key_name(b"bench:", i) for i in range(len(ordered))]
    assert drawn == keys(random_keys=True) != ordered
    assert len(set(drawn)) > len(drawn) // 2  # (spread, not a few keys over and over)
    assert {k[len(b"bench:") :] for k in drawn} <= {b"%08d" % i for i in range(1000)}
