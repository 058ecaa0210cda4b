"""The node-to-node channel (tenantkv.cluster.peer): the cluster secret in etcd,
the reserved node login, and who may run cluster-internal commands."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tenantkv import errors
from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.etcd import Etcd
from tenantkv.cluster.membership import ClusterSettings
from tenantkv.cluster.peer import SECRET_BYTES, ensure_secret, peer_session
from tenantkv.server import auth
from tests.conftest import Daemon

from .conftest import EtcdServer, settle
from .test_cluster_e2e import start_nodes


@pytest.fixture(scope="module")
def two_nodes(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[tuple[list[Daemon], str]]:
    prefix = "/t-peer-" + tmp_path_factory.mktemp("x").name[-6:]
    nodes = start_nodes(tmp_path_factory.mktemp("peer"), etcd_server, prefix, 2)
    yield nodes, prefix
    for d in nodes:
        d.kill()


async def read_secret(etcd_server: EtcdServer, prefix: str) -> bytes:
    async with Etcd([etcd_server.url]) as etcd:
        kv = await etcd.get(f"{prefix}/secret".encode())
    await settle()
    assert kv is not None
    return kv.value


def info(d: Daemon, name: str) -> NodeInfo:
    return NodeInfo(name, d.host, d.port, d.resp_port)


def test_the_node_name_is_reserved() -> None:
    with pytest.raises(errors.BadValue, match="reserved"):
        auth.validate_user_name(auth.NODE_USER)
    assert not auth.node_secret_ok(None, "")  # no cluster: no node login at all
    assert not auth.node_secret_ok(b"", "")
    secret = bytes(range(32))
    assert auth.node_secret_ok(secret, auth.node_password(secret))
    assert not auth.node_secret_ok(secret, auth.node_password(bytes(32)))


async def test_the_secret_is_created_once(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    settings = ClusterSettings((etcd_server.url,), "x", prefix=etcd_prefix)
    async with Etcd([etcd_server.url]) as etcd:
        first, second = await ensure_secret(etcd, settings), await ensure_secret(etcd, settings)
    await settle()
    assert first == second and len(first) == SECRET_BYTES


async def test_a_node_runs_an_internal_command_on_another(
    two_nodes: tuple[list[Daemon], str], etcd_server: EtcdServer
) -> None:
    nodes, prefix = two_nodes
    secret = await read_secret(etcd_server, prefix)
    assert len(secret) == SECRET_BYTES
    async with peer_session(info(nodes[1], "n1"), secret) as s:
        reply = await s.call("node_ping")
        assert reply["node"] == "n1" and reply["map_version"] >= 1
        # The node role is no admin and has no bucket: nothing else of a tenant's.
        with pytest.raises(errors.Unauthorized):
            await s.call("list_buckets")
        with pytest.raises(errors.Unauthorized):
            await s.call("create_user", {"name": "x", "password": "y"})
    await settle()


async def test_a_wrong_secret_is_refused(
    two_nodes: tuple[list[Daemon], str], etcd_server: EtcdServer
) -> None:
    nodes, prefix = two_nodes
    secret = await read_secret(etcd_server, prefix)
    wrong = bytes(b ^ 1 for b in secret)
    with pytest.raises(errors.AuthenticationFailed):
        async with peer_session(info(nodes[0], "n0"), wrong) as s:
            await s.call("node_ping")
    await settle()


def test_users_cannot_run_internal_commands_nor_be_the_node(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    nodes, _ = two_nodes
    with nodes[0].client() as admin:
        with pytest.raises(errors.Unauthorized, match="cluster-internal"):
            admin.command("node_ping")
        with pytest.raises(errors.BadValue, match="reserved"):
            admin.create_user(auth.NODE_USER, "whatever", admin=True)
        assert auth.NODE_USER not in {u["name"] for u in admin.list_users()}


async def test_a_single_node_accepts_no_node_login(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "data").start()
    try:
        with pytest.raises(errors.AuthenticationFailed):
            async with peer_session(info(d, "solo"), bytes(SECRET_BYTES)) as s:
                await s.call("node_ping")
        await settle()
    finally:
        d.kill()


async def test_calls_from_many_tasks_share_one_session(
    two_nodes: tuple[list[Daemon], str], etcd_server: EtcdServer
) -> None:
    nodes, prefix = two_nodes
    secret = await read_secret(etcd_server, prefix)
    replies: list[str] = []
    async with peer_session(info(nodes[0], "n0"), secret) as s:

        async def ping() -> None:
            replies.append((await s.call("node_ping"))["node"])

        async with trio.open_nursery() as n:
            for _ in range(20):
                n.start_soon(ping)
    await settle()
    assert replies == ["n0"] * 20
