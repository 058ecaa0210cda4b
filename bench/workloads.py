"""YCSB-style workloads for the load generator: key choosers and request plans (no I/O).

Why: the other scenarios walk the key space round-robin with one op (or a
fixed GET/SET ratio). Real key-value traffic is skewed — a few keys take most
of the requests — and mixes reads, writes, inserts and short range scans.
YCSB (Cooper et al., "Benchmarking Cloud Serving Systems with YCSB", SoCC
2010) is the common yardstick for that, so its six core workloads and its key
distributions are reproduced here; ``python -m bench ycsb`` runs them.

Key choice is a port of YCSB's generators (``site.ycsb.generator``), so a
"zipfian" here means what it means in published YCSB numbers:

- ``zipfian`` — YCSB's ``ScrambledZipfianGenerator``: a ``ZipfianGenerator``
  (Gray et al., "Quickly Generating Billion-Record Synthetic Databases",
  SIGMOD 1994) with constant 0.99 over 10^10 items (YCSB's precomputed zeta),
  each draw hashed with 64-bit FNV-1 and taken modulo the key count. The
  scramble scatters the hot keys over the key space; unscrambled, the hottest
  keys would all be the lowest ones and share a few B-tree pages. Because the
  draws come from 10^10 items and many land on each key, the skew is flatter
  than a plain zipfian over the records: over 10 000 records the hottest key
  gets ~3.8 % of the draws (1/zeta, item 0), the hottest 1 % of keys ~21 %
  and the hottest 10 % ~37 % (a plain zipfian 0.99: 9.7 %, 53 %, 77 %).
- ``uniform`` — YCSB's ``UniformLongGenerator`` over the preloaded records
  (as in YCSB, records inserted during the run are not chosen).
- ``latest`` — YCSB's ``SkewedLatestGenerator``: zipfian over recency, the
  most recently inserted key being the most popular. Workload D uses it.

The workloads are YCSB's ``workloads/workload[a-f]`` files:

====  ======================================  =============================
A     50 % read, 50 % update                  update heavy (session store)
B     95 % read, 5 % update                   read mostly (photo tagging)
C     100 % read                              read only (profile cache)
D     95 % read, 5 % insert, ``latest``       read latest (status updates)
E     95 % scan (1..100 records), 5 % insert  short ranges (threads)
F     50 % read, 50 % read-modify-write       read-modify-write
====  ======================================  =============================

A read is a GET, an update or an insert a SET of a whole value (YCSB updates
one field of ten by default; here a record is one value), a scan a ``scan``
from the chosen key for a length drawn uniformly from 1..100, a
read-modify-write a GET followed by a SET of the same key: two requests.

**Plans.** The load generator precomputes a ring of request bytes and
replays it (:mod:`bench.loadgen`), so a workload becomes a :func:`plan`: a
fixed, seeded sequence of requests. Where it differs from YCSB, and why:

- *Exact mix.* YCSB draws each op independently; a plan holds the exact
  number of each op (largest remainder) in a seeded random order, so the mix
  is the workload's at every ring length, not only on average.
- *Inserts become overwrites when the ring wraps.* An insert takes the next
  new key index (``records``, ``records + 1``, ...), and the reads chasing it
  (D) or the scans over it (E) follow in plan order. But the ring is
  replayed — over and over, by every connection from its own offset, in every
  worker process — so only the first request to reach an insert slot adds a
  record; every later pass writes the same key with the same value again, an
  overwrite. The data set therefore grows by at most the plan's insert count,
  and later "inserts" are updates of recent keys. That is an accepted
  simplification: what D and E are about (reads of recently written keys,
  scans over a range that new keys join) is kept, and a ring stays a fixed
  byte string that costs nothing per request to send.
- *Zipfian key space with inserts.* YCSB sizes the scrambled space as
  records + 2 x the inserts it expects and redraws a key not inserted yet;
  a plan knows its insert count exactly and uses records + inserts (and
  redraws the same way), so no part of the space stays unreachable.
- *Randomness.* One seeded :class:`random.Random` per plan instead of
  YCSB's per-thread ``java.util.Random``: same algorithms, other numbers.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: YCSB's ``ZipfianGenerator.ZIPFIAN_CONSTANT``.
ZIPFIAN_CONSTANT = 0.99
#: ``ScrambledZipfianGenerator``: the zipfian draws come from this many items ...
SCRAMBLED_ITEM_COUNT = 10_000_000_000
#: ... whose zeta(n, 0.99) YCSB precomputed.
SCRAMBLED_ZETAN = 26.46902820178302
#: 64-bit FNV-1 (YCSB's ``Utils.fnvhash64``).
FNV_OFFSET_BASIS_64 = 0xCBF29CE484222325
FNV_PRIME_64 = 1099511628211
_MASK64 = (1 << 64) - 1

DISTRIBUTIONS = ("zipfian", "uniform", "latest")
#: YCSB ops (``Step.kind``) and the requests each takes.
YCSB_OPS = ("read", "update", "insert", "scan", "rmw")
REQUESTS_PER = {"read": 1, "update": 1, "insert": 1, "scan": 1, "rmw": 2}
#: YCSB's ``maxscanlength`` default (scan lengths are uniform in 1..this).
MAX_SCAN_LENGTH = 100


def fnv_hash64(val: int) -> int:
    """YCSB's ``Utils.fnvhash64``: FNV-1 over the 8 low-order bytes, Java ``Math.abs``.

    Java multiplies in signed 64-bit arithmetic and returns the absolute
    value; ``Math.abs(Long.MIN_VALUE)`` stays negative in Java, here it is 2^63
    (one hash value in 2^64, never reached by the item numbers used).
    """
    h = FNV_OFFSET_BASIS_64
    for _ in range(8):
        h = ((h ^ (val & 0xFF)) * FNV_PRIME_64) & _MASK64
        val >>= 8
    return (1 << 64) - h if h >> 63 else h


def zeta(st: int, n: int, theta: float, initial: float = 0.0) -> float:
    """YCSB's ``zetastatic``: ``initial`` + sum of 1 / (i + 1)^theta for i in [st, n)."""
    return initial + sum(1.0 / (i + 1) ** theta for i in range(st, n))


class Zipfian:
    """YCSB's ``ZipfianGenerator``: item ``lo`` most popular, then ``lo + 1``, ...

    Items are ``lo..hi`` inclusive. :meth:`next_long` may be asked for a larger
    item count than at construction (the ``latest`` chooser does, as inserts
    arrive); zeta is then extended incrementally. Kept as in YCSB: ``eta`` is
    recomputed with the item count of the *construction*, not the new one.
    """

    __slots__ = (
        "_alpha",
        "_count_for_zeta",
        "_eta",
        "_half_pow",
        "_rng",
        "_zeta2",
        "_zetan",
        "base",
        "items",
        "theta",
    )

    def __init__(
        self,
        lo: int,
        hi: int,
        rng: random.Random,
        theta: float = ZIPFIAN_CONSTANT,
        zetan: float | None = None,
    ) -> None:
        self.items = hi - lo + 1
        self.base = lo
        self.theta = theta
        self._rng = rng
        self._zeta2 = zeta(0, 2, theta)
        self._alpha = 1.0 / (1.0 - theta)
        self._zetan = zeta(0, self.items, theta) if zetan is None else zetan
        self._count_for_zeta = self.items
        self._eta = self._eta_for(self._zetan)
        self._half_pow = 1.0 + 0.5**theta

    def _eta_for(self, zetan: float) -> float:
        return (1 - (2.0 / self.items) ** (1 - self.theta)) / (1 - self._zeta2 / zetan)

    def next_long(self, itemcount: int) -> int:
        """One draw from ``base .. base + itemcount - 1`` (YCSB ``nextLong``)."""
        if itemcount > self._count_for_zeta:
            self._zetan = zeta(self._count_for_zeta, itemcount, self.theta, self._zetan)
            self._count_for_zeta = itemcount
            self._eta = self._eta_for(self._zetan)
        u = self._rng.random()
        uz = u * self._zetan
        if uz < 1.0:
            return self.base
        if uz < self._half_pow:
            return self.base + 1
        return self.base + int(itemcount * (self._eta * u - self._eta + 1) ** self._alpha)

    def next(self) -> int:
        return self.next_long(self.items)


class ScrambledZipfian:
    """YCSB's ``ScrambledZipfianGenerator``: zipfian 0.99, hot items scattered over ``lo..hi``."""

    __slots__ = ("_cache", "_gen", "itemcount", "lo")

    def __init__(self, lo: int, hi: int, rng: random.Random) -> None:
        self.lo = lo
        self.itemcount = hi - lo + 1
        # YCSB: ZipfianGenerator(0, ITEM_COUNT, 0.99, ZETAN), i.e. ITEM_COUNT + 1 items
        self._gen = Zipfian(0, SCRAMBLED_ITEM_COUNT, rng, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN)
        #: hashes of the frequent (small) zipfian items: the same few recur
        self._cache: dict[int, int] = {}

    def next(self) -> int:
        v = self._gen.next()
        if v < 4096:
            h = self._cache.get(v)
            if h is None:
                h = self._cache[v] = fnv_hash64(v)
        else:
            h = fnv_hash64(v)
        return self.lo + h % self.itemcount


class Uniform:
    """YCSB's ``UniformLongGenerator``: ``lo..hi`` inclusive, all equally likely."""

    __slots__ = ("_rng", "hi", "lo")

    def __init__(self, lo: int, hi: int, rng: random.Random) -> None:
        self.lo, self.hi, self._rng = lo, hi, rng

    def next(self) -> int:
        return self._rng.randint(self.lo, self.hi)


class SkewedLatest:
    """YCSB's ``SkewedLatestGenerator``: zipfian over recency.

    ``next(last)`` with ``last`` the newest key index returns ``last - z`` with
    ``z`` zipfian over ``0 .. last - 1``: ``last`` itself is the most popular
    (as in YCSB, key 0 is never chosen).
    """

    __slots__ = ("_zipf",)

    def __init__(self, last: int, rng: random.Random) -> None:
        if last < 1:
            raise ValueError("the latest distribution needs at least 2 records")
        self._zipf = Zipfian(0, last - 1, rng)  # YCSB: ZipfianGenerator(basis.lastValue())

    def next(self, last: int) -> int:
        return last - self._zipf.next_long(last)


def key_chooser(
    distribution: str, records: int, inserts: int, rng: random.Random
) -> Callable[[int], int]:
    """A function ``last -> key index``: the key of the next read/update/scan.

    ``last`` is the newest key index inserted so far (``records - 1`` before
    any insert); ``inserts`` is how many the plan holds (zipfian key space).
    As in YCSB's ``CoreWorkload.nextKeynum``, a zipfian draw of a key not yet
    inserted is drawn again.
    """
    if distribution == "uniform":
        u = Uniform(0, records - 1, rng)
        return lambda last: u.next()
    if distribution == "latest":
        return SkewedLatest(records - 1, rng).next
    if distribution == "zipfian":
        z = ScrambledZipfian(0, records + inserts - 1, rng)

        def zipfian(last: int) -> int:
            while True:
                k = z.next()
                if k <= last:
                    return k

        return zipfian
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, not {distribution!r}")


# -- workloads -----------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One of YCSB's core workloads: its op proportions and default distribution."""

    name: str
    title: str
    #: (YCSB op, proportion) pairs; proportions sum to 1
    mix: tuple[tuple[str, float], ...]
    #: YCSB's ``requestdistribution`` for it
    distribution: str = "zipfian"

    @property
    def requests_per_op(self) -> float:
        """Requests per YCSB op (1.5 for F, whose read-modify-writes take two)."""
        return sum(p * REQUESTS_PER[op] for op, p in self.mix)

    @property
    def scans(self) -> bool:
        return any(op == "scan" and p > 0 for op, p in self.mix)

    def describe(self) -> str:
        names = {"rmw": "read-modify-write", "scan": "scan 1..100"}
        return ", ".join(f"{round(100 * p):g} % {names.get(op, op)}" for op, p in self.mix)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("A", "update heavy", (("read", 0.5), ("update", 0.5))),
        Workload("B", "read mostly", (("read", 0.95), ("update", 0.05))),
        Workload("C", "read only", (("read", 1.0),)),
        Workload("D", "read latest", (("read", 0.95), ("insert", 0.05)), "latest"),
        Workload("E", "short ranges", (("scan", 0.95), ("insert", 0.05))),
        Workload("F", "read-modify-write", (("read", 0.5), ("rmw", 0.5))),
    )
}


class Step(NamedTuple):
    """One request of a plan."""

    #: the wire op: ``get``, ``set`` or ``scan``
    op: str
    #: key index (``records`` and up: keys inserted by the plan)
    key: int
    #: ``scan``: records asked for (1..100); else 0
    count: int
    #: the YCSB op it belongs to (both steps of a read-modify-write are ``rmw``)
    kind: str


def op_counts(workload: Workload, n: int) -> dict[str, int]:
    """How many of each YCSB op a plan of exactly ``n`` requests holds.

    Largest remainder on the ideal (fractional) counts; a request left over
    that only a two-request op could take goes to the workload's most common
    one-request op.
    """
    ops = n / workload.requests_per_op
    ideal = {op: p * ops for op, p in workload.mix}
    counts = {op: int(x) for op, x in ideal.items()}
    left = n - sum(REQUESTS_PER[op] * c for op, c in counts.items())
    for op in sorted(ideal, key=lambda o: counts[o] - ideal[o]):
        if REQUESTS_PER[op] <= left:
            counts[op] += 1
            left -= REQUESTS_PER[op]
    if left:
        single = [(p, op) for op, p in workload.mix if REQUESTS_PER[op] == 1]
        counts[max(single)[1]] += left
    return counts


def plan(
    workload: str | Workload,
    n: int,
    records: int,
    distribution: str | None = None,
    seed: int = 1,
    max_scan: int = MAX_SCAN_LENGTH,
) -> list[Step]:
    """A deterministic plan of exactly ``n`` requests of ``workload`` over ``records`` keys.

    ``distribution`` None = the workload's own (``latest`` for D, else
    ``zipfian``). Keys ``0 .. records - 1`` must exist beforehand; inserts use
    ``records``, ``records + 1``, ... in order. When a ring replays the plan,
    those inserts become overwrites (see the module docstring). The two steps
    of a read-modify-write are adjacent and never split by the plan's end.
    """
    w = WORKLOADS[workload] if isinstance(workload, str) else workload
    dist = distribution or w.distribution
    if records < 2:
        raise ValueError("records must be >= 2")
    if n < 1:
        raise ValueError("n must be >= 1")
    rng = random.Random(f"ycsb-{w.name}-{dist}-{seed}")
    counts = op_counts(w, n)
    kinds = [op for op, _ in w.mix for _ in range(counts[op])]
    rng.shuffle(kinds)
    choose = key_chooser(dist, records, counts.get("insert", 0), rng)
    last = records - 1
    out: list[Step] = []
    append = out.append
    for kind in kinds:
        if kind == "insert":
            last += 1
            append(Step("set", last, 0, kind))
        elif kind == "read":
            append(Step("get", choose(last), 0, kind))
        elif kind == "update":
            append(Step("set", choose(last), 0, kind))
        elif kind == "scan":
            append(Step("scan", choose(last), rng.randint(1, max_scan), kind))
        else:  # rmw
            k = choose(last)
            append(Step("get", k, 0, kind))
            append(Step("set", k, 0, kind))
    return out


def ycsb_op_counts(steps: Sequence[Step]) -> Counter[str]:
    """YCSB ops in a plan, by kind (a read-modify-write counts once)."""
    c: Counter[str] = Counter(s.kind for s in steps if not (s.kind == "rmw" and s.op == "set"))
    return c
