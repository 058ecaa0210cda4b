"""Redis compatibility a Redis user relies on, against the real daemon with redis-py
(and redis-cli where it is installed): INFO as the tools read it, oversized
requests, SCAN across a bucket's re-creation."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest
import redis

from tenantkv import protocol
from tests.conftest import Daemon, rss_anon_mb
from tests.e2e.test_redis import connect, raw

PW = "Secret-Pa55"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("compat")
    daemon = Daemon(base / "data").start()
    with daemon.client() as c:
        for b in ("red", "blue"):
            c.create_bucket(b)
        c.create_user("alice", PW, roles={"red": "readwrite"})
        c.create_user("bob", PW, roles={"blue": "readwrite"})
    yield daemon
    daemon.kill()


@pytest.fixture
def r(d: Daemon) -> Iterator[redis.Redis]:
    c = connect(d)
    c.flushdb()
    yield c
    c.close()


def auth(user: str = "alice") -> bytes:
    return b"AUTH " + user.encode() + b" " + PW.encode() + b"\r\n"


# -- INFO --------------------------------------------------------------------------------


def test_info_has_the_fields_redis_py_and_redis_cli_read(d: Daemon, r: redis.Redis) -> None:
    info = r.info()
    # redis-py's test harness
    assert info["arch_bits"] == 64 and info["redis_version"] and info["cluster_enabled"] == 0
    # redis-cli --stat
    for field in ("connected_clients", "blocked_clients", "used_memory"):
        assert isinstance(info[field], int), field
    assert info["connected_clients"] >= 1 and info["used_memory"] > 1_000_000
    assert info["total_connections_received"] >= 1
    assert info["role"] == "master" and info["maxmemory_policy"] == "noeviction"
    assert float(info["used_cpu_user"]) > 0
    assert "db0" not in info  # an empty bucket lists no database, as in Redis
    before = r.info("stats")["total_commands_processed"]
    for i in range(25):
        r.set(f"k{i}", "v")
    stats = r.info("stats")
    assert stats["total_commands_processed"] >= before + 25  # the bucket's own work
    assert r.info("keyspace")["db0"] == {"keys": 25, "expires": 0, "avg_ttl": 0}
    # another tenant's work and keys are not this one's figures
    other = connect(d, user="bob")
    try:
        other.flushdb()
        assert "db0" not in other.info("keyspace")
        assert other.info("stats")["total_commands_processed"] < stats["total_commands_processed"]
    finally:
        other.close()
    assert r.info("tenantkv")["bucket"] == "red"


def test_info_sections_as_redis_7(d: Daemon, r: redis.Redis) -> None:
    out = raw(d, auth() + b"INFO cluster\r\nINFO nosuch\r\nINFO CLUSTER server nosuch\r\nQUIT\r\n")
    # Redis's layout: `# Name`, fields each ended by CRLF, sections apart by an
    # empty line; an unknown section adds nothing; Redis's section order.
    assert out.startswith(b"+OK\r\n$30\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n$0\r\n\r\n$")
    both = out.split(b"$0\r\n\r\n", 1)[1].split(b"\r\n", 1)[1]
    assert both.startswith(b"# Server\r\nredis_version:")
    assert both.endswith(b"\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n\r\n+OK\r\n")
    want = ["Server", "Clients", "Memory", "Persistence", "Stats", "Replication", "CPU"]
    want += ["Cluster", "Keyspace", "Tenantkv"]
    for every in (b"", b" all", b" everything", b" default"):
        text = raw(d, auth() + b"INFO" + every + b"\r\nQUIT\r\n").decode()
        assert [line for line in text.split("\r\n") if line.startswith("# ")] == [
            f"# {h}" for h in want
        ]
    resp3 = connect(d, protocol=3)
    try:
        assert resp3.info("server")["arch_bits"] == 64  # (a verbatim string on RESP3)
    finally:
        resp3.close()


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")
def test_redis_cli_stat_reads_real_figures(d: Daemon, r: redis.Redis) -> None:
    for i in range(10):
        r.set(f"s{i}", "v")
    cmd = ["redis-cli", "-h", d.host, "-p", str(d.resp_port), "--user", "alice"]
    cmd += ["--pass", PW, "--no-auth-warning", "--stat", "-i", "0.1"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            proc.stdout.readline()  # "------- data ------ ..."
            header, first = proc.stdout.readline(), proc.stdout.readline()
        finally:
            proc.kill()
    assert "keys" in header and "mem" in header and "clients" in header
    fields = first.split()
    assert fields[0] == "10" and not fields[1].startswith("-")  # keys, memory
    assert int(fields[2]) >= 1 and int(fields[3]) == 0  # clients, blocked
    assert int(fields[4]) >= 10  # requests: the bucket's commands


def test_memory_usage(r: redis.Redis) -> None:
    r.set("m", "x" * 1000)
    used = r.memory_usage("m")
    assert isinstance(used, int) and 1001 <= used < 1200  # key, record header, value
    assert r.memory_usage("m", samples=5) == used
    assert r.memory_usage("missing") is None
    with pytest.raises(redis.ResponseError, match=r"subcommand 'DOCTOR'\. Try MEMORY HELP\."):
        r.execute_command("MEMORY", "DOCTOR")


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")
@pytest.mark.parametrize("mode", ["--bigkeys", "--memkeys"])
def test_redis_cli_bigkeys_and_memkeys_complete(d: Daemon, r: redis.Redis, mode: str) -> None:
    for i in range(300):
        r.set(f"b{i}", "v" * i)
    cmd = ["redis-cli", "-h", d.host, "-p", str(d.resp_port), "--user", "alice"]
    out = subprocess.run(
        [*cmd, "--pass", PW, "--no-auth-warning", mode], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "Sampled 300 keys" in out.stdout and "failed" not in out.stdout
    assert "Biggest string found '\"b299\"'" in out.stdout


# -- oversized requests ----------------------------------------------------------------


class CountingProxy:
    """A loopback TCP proxy that counts the bytes a client sends the server: what
    the client sent, as the server received it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sent = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                if upstream:
                    self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def test_an_oversized_set_is_one_error_that_redis_py_does_not_retry(d: Daemon) -> None:
    """A 21 MiB SET (over max_value_bytes, 20 MiB) is answered with one error, sent
    once (counted between redis-py and the server), never buffered whole, and the
    same connection's next command works."""
    proxy = CountingProxy((d.host, d.resp_port))
    c = redis.Redis(host="127.0.0.1", port=proxy.port, username="alice", password=PW)
    try:
        me = c.client_id()
        assert d.proc is not None
        pid = d.proc.pid
        rss_before = rss_anon_mb(pid)
        value = b"v" * (21 * 1024 * 1024)
        with pytest.raises(redis.ResponseError, match="max_value_bytes") as caught:
            c.set("big", value)
        assert "was not run" in str(caught.value)
        grown = rss_anon_mb(pid) - rss_before
        assert grown < 10, f"the server grew {grown:.1f} MiB: the value was buffered"
        assert c.client_id() == me  # the same connection goes on
        assert c.get("big") is None and c.set("small", "ok") and c.get("small") == b"ok"
        assert len(value) < proxy.sent < 2 * len(value)  # sent once, not retried
        # A pipeline carries on past it, in order.
        pipe = c.pipeline(transaction=False)
        pipe.set("a", "1").set("b", value).get("a")
        out = pipe.execute(raise_on_error=False)
        assert out[0] is True and isinstance(out[1], redis.ResponseError) and out[2] == b"1"
        assert c.client_id() == me and proxy.sent < 3 * len(value)
    finally:
        c.close()
        proxy.close()
    assert len(value) > protocol.MAX_VALUE_BYTES


def test_an_oversized_value_before_auth_closes(d: Daemon) -> None:
    out = raw(d, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (21 * 1024 * 1024))
    assert out == b"-ERR Protocol error: invalid bulk length\r\n"


# -- the string and keyspace commands on the MessagePack door -------------------------------


def test_string_commands_answer_alike_on_both_doors(d: Daemon, r: redis.Redis) -> None:
    """The same calls through the bundled client (MessagePack) and redis-py (RESP)
    on twin keys: the same results, from the one implementation per command."""
    from tenantkv import errors

    with d.client(user="alice", password=PW, bucket="red") as c:
        for k in ("m:", "r:"):
            r.set(k + "a", "Hello World")
            r.set(k + "b", "Help Wanted")
        got = {
            "getrange": (c.getrange("m:a", 0, 4), r.getrange("r:a", 0, 4)),
            "getrange-": (c.getrange("m:a", -5, -1), r.getrange("r:a", -5, -1)),
            "setrange": (c.setrange("m:a", 6, "Redis"), r.setrange("r:a", 6, "Redis")),
            "append": (c.append("m:a", "!"), r.append("r:a", "!")),
            "strlen": (c.strlen("m:a"), r.strlen("r:a")),
            "setbit": (c.setbit("m:bits", 7, 1), r.setbit("r:bits", 7, 1)),
            "getbit": (c.getbit("m:bits", 7), r.getbit("r:bits", 7)),
            "bitcount": (c.bitcount("m:a"), r.bitcount("r:a")),
            "bitcount range": (c.bitcount("m:a", 1, 3, "bit"), r.bitcount("r:a", 1, 3, "BIT")),
            "bitpos": (c.bitpos("m:bits", 1), r.bitpos("r:bits", 1)),
            "bitop": (c.bitop("or", "m:or", ["m:a", "m:b"]), r.bitop("OR", "r:or", "r:a", "r:b")),
            "incrbyfloat": (c.incrbyfloat("m:f", 10.5), r.incrbyfloat("r:f", 10.5)),
            "lcs": (c.lcs("m:a", "m:b"), r.lcs("r:a", "r:b")),
            "lcs len": (c.lcs("m:a", "m:b", length=True), r.lcs("r:a", "r:b", len=True)),
            "copy": (c.copy("m:a", "m:c"), r.copy("r:a", "r:c")),
            "copy again": (c.copy("m:a", "m:c"), r.copy("r:a", "r:c")),
            "renamenx": (c.renamenx("m:c", "m:b"), r.renamenx("r:c", "r:b")),
            "getdel": (c.getdel("m:b"), r.getdel("r:b")),
        }
        for name, (mp, rs) in got.items():
            if isinstance(rs, float):
                mp = float(mp)  # (redis-py parses INCRBYFLOAT's decimal reply)
            assert mp == rs, name
        assert c.getrange("m:a", 0, -1) == r.getrange("r:a", 0, -1) == b"Hello Redis!"
        assert c.rename("m:a", "m:z") is True and c.get("m:z") == b"Hello Redis!"
        assert c.randomkey() is not None
        # Both doors see one store: what one writes the other reads.
        c.setrange("shared", 0, "abc")
        assert r.getrange("shared", 0, -1) == b"abc"
        # The same errors, from the same parser and handler.
        with pytest.raises(redis.ResponseError) as resp_err:
            r.execute_command("SETBIT", "r:bits", 7, 2)  # (redis-py's setbit sends 0 or 1)
        with pytest.raises(errors.TenantKVError) as mp_err:
            c.setbit("m:bits", 7, 2)
        assert mp_err.value.errmsg == str(resp_err.value)
        with pytest.raises(errors.TenantKVError, match="'start' must be an integer"):
            c.command("getrange", key=b"k", start="0", end=1)
        with pytest.raises(errors.TenantKVError, match="unknown parameter"):
            c.command("strlen", key=b"k", typo=1)


def test_string_commands_are_held_to_roles_on_the_messagepack_door(d: Daemon) -> None:
    from tenantkv import errors

    with d.client() as admin:
        admin.create_user("viewer", PW, roles={"red": "read"})
    with d.client(user="viewer", password=PW, bucket="red") as c:
        assert c.strlen("nothing") == 0
        with pytest.raises(errors.TenantKVError, match="readwrite"):
            c.setrange("k", 0, "x")


# -- SCAN across a bucket's deletion and re-creation ---------------------------------------


def test_a_scan_cursor_across_bucket_delete_and_recreate(d: Daemon) -> None:
    """A cursor issued before its bucket was deleted and made again under the same
    name never yields the old bucket's keys and never fails but as Redis's
    errors: the old connection is left without a bucket, a new one resumes in
    the new bucket (or is told the cursor is unknown)."""
    with d.client() as admin:
        admin.create_bucket("cyc")
        admin.create_user("carol", PW, roles={"cyc": "readwrite"})
    old = connect(d, user="carol")
    try:
        old.mset({f"old:{i:03}": "v" for i in range(30)})
        cursor, page = old.scan(0, count=10)
        assert cursor != 0 and len(page) == 10
        with d.client() as admin:
            admin.delete_bucket("cyc")
            admin.create_bucket("cyc")
            admin.command("update_user", name="carol", roles={"cyc": "readwrite"})
        with pytest.raises(redis.ResponseError, match="no bucket selected"):
            old.scan(cursor, count=10)  # its bucket is gone: no bucket, no crash
        new = connect(d, user="carol")
        try:
            new.mset({f"new:{i:03}": "v" for i in range(30)})
            seen: list[bytes] = []
            try:
                while True:
                    cursor, page = new.scan(cursor, count=10)
                    seen += page
                    if cursor == 0:
                        break
            except redis.ResponseError as exc:
                assert "invalid cursor" in str(exc)
            assert all(k.startswith(b"new:") for k in seen), seen
            # and a scan from 0 sees exactly the new bucket
            assert sorted(new.scan_iter(count=7)) == [f"new:{i:03}".encode() for i in range(30)]
        finally:
            new.close()
    finally:
        old.close()


def test_client_tracking_off_answers_as_redis(d: Daemon) -> None:
    """A connection whose tracking is off answers as Redis 7.0's does (tracking
    itself: tests/e2e/test_redis_tracking.py)."""
    c = connect(d, protocol=3)
    try:
        assert c.client_tracking_off() in (True, b"OK", "OK")
        info = c.client_trackinginfo()  # (redis-py gives RESP3's set as a list)
        assert info == {b"flags": [b"off"], b"redirect": -1, b"prefixes": []}
        assert c.client_getredir() == -1
        with pytest.raises(redis.ResponseError, match="only when the client is in tracking mode"):
            c.execute_command("CLIENT", "CACHING", "YES")
    finally:
        c.close()
    out = raw(d, auth() + b"CLIENT TRACKINGINFO\r\nCLIENT TRACKING maybe\r\nQUIT\r\n")
    assert out == (
        b"+OK\r\n*6\r\n$5\r\nflags\r\n*1\r\n$3\r\noff\r\n$8\r\nredirect\r\n:-1\r\n"
        b"$8\r\nprefixes\r\n*0\r\n-ERR syntax error\r\n+OK\r\n"
    )


def test_a_command_costs_the_same_units_on_both_doors(d: Daemon, r: redis.Redis) -> None:
    """One implementation, one admission and charging: GETRANGE and SETRANGE on a
    10 kB value cost the bucket the same read and write units whichever door."""

    def units() -> tuple[int, int]:
        t = r.info("tenantkv")
        return t["ru_total"], t["wu_total"]

    value = b"x" * 10_000
    r.set("twin:m", value)
    r.set("twin:r", value)
    with d.client(user="alice", password=PW, bucket="red") as c:
        more = b"y" * 3000
        calls = [
            (lambda: c.getrange("twin:m", 0, -1), lambda: r.getrange("twin:r", 0, -1)),
            (lambda: c.setrange("twin:m", 9_000, more), lambda: r.setrange("twin:r", 9_000, more)),
        ]
        for mp_call, resp_call in calls:
            before = units()
            mp_call()
            middle = units()
            resp_call()
            after = units()
            mp_cost = (middle[0] - before[0], middle[1] - before[1])
            resp_cost = (after[0] - middle[0], after[1] - middle[1])
            assert mp_cost == resp_cost and sum(mp_cost) > 2, (mp_cost, resp_cost)
