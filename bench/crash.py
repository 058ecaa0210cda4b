"""``python -m bench crash``: acknowledged writes across SIGKILL cycles (target: 0 lost).

One daemon with the durable defaults, on one data directory that every cycle
reuses. A plain ``bench`` user with the readwrite role on one bucket writes.
Each of ``--cycles`` cycles:

1. ``--writers`` threads, each with its own blocking client, write as fast as
   they are answered: durable SETs of new keys (45 %), pipelined batches of
   2-40 new keys (20 %), overwrites of the writer's 4 *slot* keys by plain SET
   (10 %) and by read + compare-and-swap (10 %), and INCRs of the writer's
   counter (15 %). A key or slot value names its write (``c3:w5:n118``; the
   value is that tag plus 32 B-2 KB derived from it), so a stored value tells
   exactly which write put it there. A write is *acknowledged* when its call
   returned (a pipelined one when ``execute()`` returned; until then the whole
   batch is in flight) and *in flight* when it was sent and no answer came.
2. After ``--run-seconds`` x uniform(0.5, 1.5) of writing (``--seed``) the
   daemon gets SIGKILL: no shutdown, no flush.
3. It restarts on the same directory (*restart ms*: from exec to its ready
   file, ~20 ms resolution), and the cycle's writes are checked (*check ms*):

   - an acknowledged new key must hold exactly its value, else it is *lost*;
   - a slot must hold its last acknowledged value or one sent after it (in
     flight); an older value or none means that acknowledged write is *lost*;
   - a counter must lie between its verified value plus the acknowledged INCRs
     and plus the sent ones: a shortfall is that many *lost* INCRs, the
     excess over the acknowledged ones are in-flight INCRs that survived;
   - an in-flight write may be present (it *survived*) or absent (both are
     fine); a value that is neither, or a counter above what was sent, is
     *corrupt*.

After the last cycle, every acknowledged new key of every cycle is read once
more: a later crash must not take an earlier cycle's writes either.

Exit status 1 if an acknowledged write was lost, a value was corrupt, or a
cycle acknowledged nothing (and so measured nothing); 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import options, report, servers
from bench.loadgen import BenchError
from bench.options import Quick

BUCKET = "crash"
SLOTS = 4
#: value sizes, picked by a hash of the write's tag
SIZES = (32, 100, 400, 2000)
#: keys per mget when checking
READ_CHUNK = 500
#: per-operation timeout of the writers' clients (a dead daemon answers at once: EOF)
CLIENT_TIMEOUT = 10.0
START_TIMEOUT = 30.0
JOIN_TIMEOUT = 30.0
#: a writer stops after this many error replies (something is wrong, not a crash)
MAX_WRITER_ERRORS = 100
#: lost/corrupt writes named on stdout (the JSON keeps up to DETAIL_JSON)
DETAIL_PRINTED = 20
DETAIL_JSON = 1000
KINDS = ("set", "pipelined_set", "slot_set", "cas", "incr")


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--cycles", int, Quick(10, 3), "kill/restart cycles", low=1)
    options.add(p, "--writers", int, 8, "concurrent writer threads", low=1)
    options.add(
        p,
        "--run-seconds",
        float,
        Quick(2.0, 1.0),
        "mean seconds of writing before the kill; each cycle kills after uniform(0.5, 1.5) x this",
        above=0,
    )
    options.add(p, "--seed", int, 1, "random seed (kill times, op mix)")
    p.add_argument(
        "--data-dir",
        help="data directory, kept afterwards; must be new or empty "
        "[a temp dir, removed unless a write was lost]",
    )
    options.json_flag(p)
    options.quick_flag(p, "a fast smoke run (see [... quick ...])")


def _finish_args(args: argparse.Namespace) -> None:
    options.check(
        not (args.data_dir and os.path.exists(args.data_dir) and os.listdir(args.data_dir)),
        f"--data-dir {args.data_dir} is not empty",
    )


# -- writes ---------------------------------------------------------------------------------


def value_for(tag: bytes) -> bytes:
    """The value a write with this tag stores: the tag, ``|``, then bytes derived from it."""
    digest = hashlib.blake2b(tag).digest()
    size = SIZES[digest[0] % len(SIZES)]
    head = tag + b"|"
    return (head + digest * (size // len(digest) + 1))[: max(size, len(head))]


def tag_of(value: bytes) -> bytes | None:
    """The tag of a value some write stored whole; None for a torn or foreign value."""
    tag, sep, _ = value.partition(b"|")
    return tag if sep and value_for(tag) == value else None


def _show(value: bytes | None) -> str:
    if value is None:
        return "nothing"
    tag = tag_of(value)
    return f"the value of {tag.decode()}" if tag else f"a foreign value {value[:40]!r}"


@dataclass
class Slot:
    """A key its writer overwrites; what it must hold after a crash."""

    key: bytes
    #: tag of the value it must hold: the last acknowledged (or last verified) one
    acked: bytes | None
    #: tags sent after that one and not acknowledged: any of them may be there instead
    pending: list[bytes] = field(default_factory=list)


@dataclass
class Writer:
    """One writer's ledger. Slots and the counter live across cycles, the rest per cycle."""

    wid: int
    slots: list[Slot]
    counter: bytes
    #: the counter's value verified after the last restart
    base: int = 0
    cycle: int = 0
    seq: int = 0
    #: sequence numbers of new keys: acknowledged, being sent, sent without an answer
    acked: list[int] = field(default_factory=list)
    sending: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    incr_sent: int = 0
    errors: int = 0
    error_sample: list[str] = field(default_factory=list)
    ended: str = ""

    def begin(self, cycle: int) -> None:
        self.cycle, self.seq = cycle, 0
        self.acked, self.sending, self.unknown = [], [], []
        self.kinds = dict.fromkeys(KINDS, 0)
        self.incr_sent = self.errors = 0
        self.error_sample, self.ended = [], ""

    def key(self, seq: int) -> bytes:
        return f"c{self.cycle}:w{self.wid}:n{seq}".encode()

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def step(self, c: Any, rng: random.Random) -> None:
        """One operation; raises what the client raised."""
        r = rng.random()
        if r < 0.45:  # one durable SET of a new key
            seq = self._next()
            self.sending = [seq]
            c.set(self.key(seq), value_for(self.key(seq)))
            self._acked_sending("set")
        elif r < 0.65:  # a pipeline: one write of many SETs
            self.sending = [self._next() for _ in range(rng.randint(2, 40))]
            p = c.pipeline(raise_on_error=False)
            for seq in self.sending:
                p.set(self.key(seq), value_for(self.key(seq)))
            results = p.execute()
            for seq, res in zip(self.sending, results, strict=True):
                if isinstance(res, BaseException):
                    self.unknown.append(seq)
                    self.note_error(res)
                else:
                    self.acked.append(seq)
                    self.kinds["pipelined_set"] += 1
            self.sending = []
        elif r < 0.85:  # overwrite a slot: plain SET, or read + compare-and-swap
            j = rng.randrange(SLOTS)
            slot = self.slots[j]
            tag = f"w{self.wid}:s{j}@c{self.cycle}:n{self._next()}".encode()
            if r < 0.75:
                slot.pending.append(tag)
                c.set(slot.key, value_for(tag))
                kind = "slot_set"
            else:
                rec = c.get_record(slot.key)
                slot.pending.append(tag)
                if rec is None:
                    c.set(slot.key, value_for(tag), mode="add")
                else:
                    c.set(slot.key, value_for(tag), cas=rec.cas)
                kind = "cas"
            slot.acked, slot.pending = tag, []
            self.kinds[kind] += 1
        else:  # a read-modify-write on the server
            self.incr_sent += 1
            c.incr(self.counter)
            self.kinds["incr"] += 1

    def _acked_sending(self, kind: str) -> None:
        self.acked += self.sending
        self.kinds[kind] += len(self.sending)
        self.sending = []

    def unanswered(self) -> None:
        """What was being sent got no answer: its outcome is unknown (in flight)."""
        self.unknown += self.sending
        self.sending = []

    def note_error(self, exc: BaseException) -> None:
        self.errors += 1
        if len(self.error_sample) < 5:
            self.error_sample.append(f"w{self.wid}: {exc!r}"[:200])


def write_loop(
    w: Writer,
    srv: servers.ServerHandle,
    creds: tuple[str, str],
    seed: int,
    ready: threading.Event,
    stop: threading.Event,
) -> None:
    """Write until the connection dies (the kill) or ``stop``."""
    import tenantkv
    from tenantkv import errors

    rng = random.Random(seed)
    try:
        c = tenantkv.Client(
            srv.host,
            srv.port,
            user=creds[0],
            password=creds[1],
            bucket=BUCKET,
            timeout=CLIENT_TIMEOUT,
        )
    except (errors.TenantKVError, OSError) as exc:
        w.ended = f"could not connect: {exc!r}"[:200]
        return
    finally:
        ready.set()
    with c:
        while not stop.is_set():
            try:
                w.step(c, rng)
            except errors.ServerError as exc:
                # An error reply: the connection lives; that write's outcome stays unknown.
                w.unanswered()
                w.note_error(exc)
                if w.errors >= MAX_WRITER_ERRORS:
                    w.ended = f"gave up after {w.errors} errors"
                    return
            except (errors.TenantKVError, OSError) as exc:
                w.unanswered()
                w.ended = repr(exc)[:200]
                return


# -- checks ---------------------------------------------------------------------------------


@dataclass
class Check:
    acknowledged: int = 0
    lost: int = 0
    in_flight: int = 0
    in_flight_survived: int = 0
    corrupt: int = 0
    lost_detail: list[str] = field(default_factory=list)
    corrupt_detail: list[str] = field(default_factory=list)

    def lose(self, n: int, what: str) -> None:
        self.lost += n
        if len(self.lost_detail) < DETAIL_JSON:
            self.lost_detail.append(what)

    def spoil(self, what: str) -> None:
        self.corrupt += 1
        if len(self.corrupt_detail) < DETAIL_JSON:
            self.corrupt_detail.append(what)


def read_all(c: Any, keys: Sequence[bytes]) -> Iterator[tuple[bytes, bytes | None]]:
    """(key, stored value or None) for each key, read ``READ_CHUNK`` keys at a time."""
    for i in range(0, len(keys), READ_CHUNK):
        chunk = keys[i : i + READ_CHUNK]
        yield from zip(chunk, c.mget(chunk), strict=True)


def check_cycle(c: Any, writers: Sequence[Writer], cycle: int) -> tuple[Check, list[bytes]]:
    """Check one cycle's writes after the restart; returns the check and the
    acknowledged new keys found intact (for the final check). Moves each slot's
    and counter's baseline to what is stored, so a loss is counted once."""
    chk = Check()
    acked = [w.key(s) for w in writers for s in w.acked]
    unknown = [w.key(s) for w in writers for s in w.unknown]
    intact = []
    for key, got in read_all(c, acked):
        if got == value_for(key):
            intact.append(key)
        else:
            chk.lose(1, f"cycle {cycle}: acknowledged SET {key.decode()} holds {_show(got)}")
    chk.acknowledged += len(acked)
    chk.in_flight += len(unknown)
    for key, got in read_all(c, unknown):
        if got == value_for(key):
            chk.in_flight_survived += 1
        elif got is not None:
            chk.spoil(f"cycle {cycle}: in-flight SET {key.decode()} holds {_show(got)}")
    slots = [s for w in writers for s in w.slots]
    stored = dict(read_all(c, [s.key for s in slots] + [w.counter for w in writers]))
    for w in writers:
        chk.acknowledged += w.kinds["slot_set"] + w.kinds["cas"]
    for s in slots:
        got = stored[s.key]
        tag = None if got is None else tag_of(got)
        chk.in_flight += len(s.pending)
        if tag is not None and tag in s.pending:
            chk.in_flight_survived += 1
        elif tag != s.acked:
            where = f"cycle {cycle}: slot {s.key.decode()} holds {_show(got)}"
            if got is not None and (tag is None or s.acked is None):
                chk.spoil(where)  # torn, or a value where none may be
            if s.acked is not None:
                chk.lose(1, f"{where}, not the acknowledged {s.acked.decode()}")
        s.acked, s.pending = tag, []
    for w in writers:
        got = stored[w.counter]
        lo, hi = w.base + w.kinds["incr"], w.base + w.incr_sent
        chk.acknowledged += w.kinds["incr"]
        chk.in_flight += w.incr_sent - w.kinds["incr"]
        try:
            value = int(got or b"")
        except ValueError:
            chk.spoil(f"cycle {cycle}: counter {w.counter.decode()} holds {got!r:.60}")
            chk.lose(w.kinds["incr"], f"cycle {cycle}: counter {w.counter.decode()} unreadable")
            value = lo
        if value < lo:
            chk.lose(
                lo - value,
                f"cycle {cycle}: counter {w.counter.decode()} is {value}, "
                f"{lo - value} acknowledged INCR(s) short of {lo}",
            )
        elif value > hi:
            chk.spoil(
                f"cycle {cycle}: counter {w.counter.decode()} is {value}, "
                f"above the {hi} sent INCRs allow"
            )
        else:
            chk.in_flight_survived += value - lo
        w.base = value
    return chk, intact


# -- the daemon across cycles ---------------------------------------------------------------


class Daemon:
    """The current daemon on the shared data directory: start, SIGKILL, start again."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self._stack = contextlib.ExitStack()
        self.handle: servers.ServerHandle | None = None

    def start(self) -> float:
        """Start on the data directory; returns the ms from exec to ready."""
        self.close()
        t0 = time.perf_counter()
        self.handle = self._stack.enter_context(servers.tenantkv_server(self.data_dir))
        return (time.perf_counter() - t0) * 1000

    def kill(self) -> None:
        assert self.handle is not None
        rc = self.handle.kill()
        if rc != -signal.SIGKILL:
            raise BenchError(
                f"the daemon had exited (status {rc}) before the kill:\n{self.handle.log_tail()}"
            )

    def close(self) -> None:
        self._stack.close()
        self.handle = None


@contextlib.contextmanager
def data_directory(path: str | None) -> Iterator[tuple[str, list[bool]]]:
    """The data directory (a temp one unless given) and a flag list: set ``keep[0]``
    to keep a temp directory for inspection."""
    if path:
        yield path, [True]
        return
    root = tempfile.mkdtemp(prefix="tenantkv-crash-")
    keep = [False]
    try:
        yield os.path.join(root, "data"), keep
    finally:
        if keep[0]:
            report.log(f"data directory kept for inspection: {root}/data")
        else:
            shutil.rmtree(root, ignore_errors=True)


def setup(srv: servers.ServerHandle, creds: tuple[str, str], writers: Sequence[Writer]) -> None:
    """Give every slot a first value and every counter 0, acknowledged."""
    import tenantkv

    with (
        tenantkv.Client(srv.host, srv.port, user=creds[0], password=creds[1], bucket=BUCKET) as c,
        c.pipeline() as p,
    ):
        for w in writers:
            for s in w.slots:
                p.set(s.key, value_for(s.acked or b""))
            p.set(w.counter, b"0")


def run_cycle(
    d: Daemon,
    creds: tuple[str, str],
    writers: Sequence[Writer],
    cycle: int,
    kill_after: float,
    seeds: Sequence[int],
) -> float:
    """Write, SIGKILL after ``kill_after`` s; returns the seconds written."""
    assert d.handle is not None
    stop = threading.Event()
    ready = [threading.Event() for _ in writers]
    for w in writers:
        w.begin(cycle)
    threads = [
        threading.Thread(
            target=write_loop,
            args=(w, d.handle, creds, seed, ev, stop),
            name=f"crash-writer-{w.wid}",
            daemon=True,
        )
        for w, seed, ev in zip(writers, seeds, ready, strict=True)
    ]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        for ev in ready:
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                raise BenchError("writers did not connect")
        t0 = time.monotonic()
        time.sleep(kill_after)
        d.kill()
        written = time.monotonic() - t0
    finally:
        stop.set()
        for t in threads:
            t.join(JOIN_TIMEOUT)
    if any(t.is_alive() for t in threads):
        raise BenchError("writers did not stop after the kill")
    return written


def cycle_row(
    cycle: int, written: float, restart_ms: float, check_ms: float, chk: Check, ws: Sequence[Writer]
) -> dict[str, Any]:
    kinds = {k: sum(w.kinds[k] for w in ws) for k in KINDS}
    return {
        "cycle": cycle,
        "written_s": round(written, 3),
        "acknowledged": chk.acknowledged,
        "acknowledged_by_kind": kinds,
        "acknowledged_per_s": round(chk.acknowledged / written, 1) if written > 0 else None,
        "lost": chk.lost,
        "in_flight": chk.in_flight,
        "in_flight_survived": chk.in_flight_survived,
        "corrupt": chk.corrupt,
        "restart_ms": round(restart_ms, 1),
        "check_ms": round(check_ms, 1),
        "writer_errors": sum(w.errors for w in ws),
        "error_sample": [e for w in ws for e in w.error_sample][:10],
        "writers_ended": sorted({w.ended.split(":")[0].split("(")[0] for w in ws if w.ended}),
    }


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    out = sys.stderr if args.json == "-" else sys.stdout
    meta = report.run_meta(args)
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    rows: list[dict[str, Any]] = []
    lost_detail: list[str] = []
    corrupt_detail: list[str] = []
    history: list[bytes] = []
    final: dict[str, Any] = {}
    start_ms = 0.0
    with data_directory(args.data_dir) as (data_dir, keep):
        writers = [
            Writer(
                wid,
                [
                    Slot(f"slot:w{wid}:{j}".encode(), f"w{wid}:s{j}@init".encode())
                    for j in range(SLOTS)
                ],
                f"ctr:w{wid}".encode(),
            )
            for wid in range(args.writers)
        ]
        d = Daemon(data_dir)
        try:
            report.log(f"crash: starting tenantkv on {data_dir} ...")
            start_ms = d.start()
            assert d.handle is not None
            meta["server"] = {"version": d.handle.version, "settings": d.handle.settings}
            creds = servers.prepare_tenantkv(d.handle, BUCKET, dedicated_user=True)
            setup(d.handle, creds, writers)
            for cycle in range(1, args.cycles + 1):
                kill_after = args.run_seconds * rng.uniform(0.5, 1.5)
                seeds = [rng.randrange(2**32) for _ in writers]
                written = run_cycle(d, creds, writers, cycle, kill_after, seeds)
                restart_ms = d.start()
                t0 = time.perf_counter()
                chk, intact = _check(d, creds, writers, cycle)
                check_ms = (time.perf_counter() - t0) * 1000
                history += intact
                lost_detail += chk.lost_detail
                corrupt_detail += chk.corrupt_detail
                row = cycle_row(cycle, written, restart_ms, check_ms, chk, writers)
                rows.append(row)
                report.log(
                    f"  cycle {cycle}/{args.cycles}: SIGKILL after {written:.2f} s; "
                    f"{chk.acknowledged:,} acknowledged, {chk.lost} lost, {chk.in_flight} in "
                    f"flight ({chk.in_flight_survived} survived), {chk.corrupt} corrupt; "
                    f"restart {restart_ms:.0f} ms, check {check_ms:.0f} ms"
                    + (f"; {row['writer_errors']} writer errors" if row["writer_errors"] else "")
                )
            report.log(f"  final check: {len(history):,} acknowledged keys of all cycles ...")
            final = _final_check(d, creds, history)
            lost_detail += final["lost_detail"]
        finally:
            d.close()
        summary = _summary(rows, final, start_ms)
        keep[0] = keep[0] or summary["lost"] > 0 or summary["corrupt"] > 0
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    _print(out, args, meta, rows, summary, lost_detail, corrupt_detail)
    if args.json:
        report.write_json(
            args.json,
            {
                "benchmark": "crash",
                "meta": meta,
                "cycles": rows,
                "summary": summary,
                "lost_writes": lost_detail[:DETAIL_JSON],
                "corrupt_writes": corrupt_detail[:DETAIL_JSON],
            },
        )
    return 0 if summary["target_met"] and summary["cycles_without_ack"] == 0 else 1


def _check(
    d: Daemon, creds: tuple[str, str], writers: Sequence[Writer], cycle: int
) -> tuple[Check, list[bytes]]:
    import tenantkv

    assert d.handle is not None
    with tenantkv.Client(
        d.handle.host, d.handle.port, user=creds[0], password=creds[1], bucket=BUCKET
    ) as c:
        return check_cycle(c, writers, cycle)


def _final_check(d: Daemon, creds: tuple[str, str], keys: Sequence[bytes]) -> dict[str, Any]:
    """Re-read every acknowledged new key that an earlier check found intact."""
    import tenantkv

    assert d.handle is not None
    t0 = time.perf_counter()
    detail = []
    with tenantkv.Client(
        d.handle.host, d.handle.port, user=creds[0], password=creds[1], bucket=BUCKET
    ) as c:
        for key, got in read_all(c, keys):
            if got != value_for(key):
                detail.append(
                    f"after the last cycle: acknowledged SET {key.decode()} holds {_show(got)}"
                )
    return {
        "keys": len(keys),
        "lost": len(detail),
        "ms": round((time.perf_counter() - t0) * 1000, 1),
        "lost_detail": detail[:DETAIL_JSON],
    }


def _summary(
    rows: Sequence[dict[str, Any]], final: dict[str, Any], start_ms: float
) -> dict[str, Any]:
    def total(k: str) -> int:
        return sum(r[k] for r in rows)

    restarts = [r["restart_ms"] for r in rows]
    lost = total("lost") + final.get("lost", 0)
    return {
        "cycles": len(rows),
        "acknowledged": total("acknowledged"),
        "acknowledged_by_kind": {k: sum(r["acknowledged_by_kind"][k] for r in rows) for k in KINDS},
        "lost": lost,
        "in_flight": total("in_flight"),
        "in_flight_survived": total("in_flight_survived"),
        "corrupt": total("corrupt"),
        "restart_ms_max": max(restarts, default=None),
        "restart_ms_median": round(statistics.median(restarts), 1) if restarts else None,
        "first_start_ms": round(start_ms, 1),
        "check_ms_max": max((r["check_ms"] for r in rows), default=None),
        "writer_errors": total("writer_errors"),
        "cycles_without_ack": sum(1 for r in rows if r["acknowledged"] == 0),
        "final_check": {k: v for k, v in final.items() if k != "lost_detail"},
        "target": "0 acknowledged writes lost over all crash cycles",
        "target_met": lost == 0 and total("corrupt") == 0,
    }


def _print(
    out: Any,
    args: argparse.Namespace,
    meta: dict[str, Any],
    rows: Sequence[dict[str, Any]],
    summary: dict[str, Any],
    lost_detail: Sequence[str],
    corrupt_detail: Sequence[str],
) -> None:
    m = meta["machine"]
    print(
        f"\ncrash: {args.cycles} SIGKILL cycles on one data directory, {args.writers} writer "
        f"threads, kill after {args.run_seconds:g} s x uniform(0.5, 1.5), seed {args.seed}"
        f"{' (quick)' if args.quick else ''}\n"
        f"writes: durable SET of new keys, pipelined SETs (2-40), slot SET and CAS overwrites, "
        f"INCR; durability: fsync (default)\n"
        f"{report.version_line(meta)}; {m['cpus']} cores ({m['cpu_model']}) shared by the "
        f"daemon and the writers\n",
        file=out,
    )
    head = (
        f"{'cycle':>5} {'kill s':>6} {'acked':>9} {'acked/s':>8} {'lost':>5} "
        f"{'in flight':>9} {'survived':>8} {'corrupt':>7} {'restart ms':>10} {'check ms':>8} "
        f"{'errors':>6}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        print(
            f"{r['cycle']:>5} {r['written_s']:>6.2f} {r['acknowledged']:>9,} "
            f"{r['acknowledged_per_s'] or 0:>8,.0f} {r['lost']:>5} {r['in_flight']:>9,} "
            f"{r['in_flight_survived']:>8,} {r['corrupt']:>7} {r['restart_ms']:>10.0f} "
            f"{r['check_ms']:>8.0f} {r['writer_errors']:>6}",
            file=out,
        )
    s = summary
    written = sum(r["written_s"] for r in rows)
    print("-" * len(head), file=out)
    print(
        f"{'all':>5} {written:>6.1f} {s['acknowledged']:>9,} "
        f"{s['acknowledged'] / written if written else 0:>8,.0f} {s['lost']:>5} "
        f"{s['in_flight']:>9,} {s['in_flight_survived']:>8,} {s['corrupt']:>7} "
        f"{'max ' + format(s['restart_ms_max'] or 0, '.0f'):>10} "
        f"{'max ' + format(s['check_ms_max'] or 0, '.0f'):>8} {s['writer_errors']:>6}",
        file=out,
    )
    kinds = s["acknowledged_by_kind"]
    print(
        "\nacknowledged by kind: "
        + ", ".join(
            f"{n} {kinds[k]:,}"
            for k, n in zip(KINDS, ("SET", "pipelined SET", "slot SET", "CAS", "INCR"), strict=True)
        ),
        file=out,
    )
    f = s["final_check"]
    if f:
        print(
            f"final check: {f['keys']:,} acknowledged keys of all cycles re-read after the last "
            f"restart, {f['lost']} lost ({f['ms']:.0f} ms)",
            file=out,
        )
    print(
        f"restart (exec to ready): median {s['restart_ms_median']:.0f} ms, max "
        f"{s['restart_ms_max']:.0f} ms; first start {s['first_start_ms']:.0f} ms",
        file=out,
    )
    verdict = "MET" if s["target_met"] else "MISSED"
    print(
        f"\ntarget: {s['target']}: {verdict} ({s['lost']} of {s['acknowledged']:,} lost, "
        f"{s['corrupt']} corrupt)",
        file=out,
    )
    for title, detail in (("lost", lost_detail), ("corrupt", corrupt_detail)):
        if detail:
            print(f"\n{title} writes ({len(detail)}):", file=out)
            for line in detail[:DETAIL_PRINTED]:
                print(f"  {line}", file=out)
            if len(detail) > DETAIL_PRINTED:
                print(f"  ... {len(detail) - DETAIL_PRINTED} more (see --json)", file=out)
    if s["cycles_without_ack"]:
        print(
            f"\n{s['cycles_without_ack']} cycle(s) acknowledged no write, so they measured "
            "nothing (see writers_ended / error_sample in --json)",
            file=out,
        )
    print(f"\n({meta['elapsed_s']:g} s)", file=out)
