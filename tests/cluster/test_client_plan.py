"""The cluster clients' plan, sans-IO: where each call goes and how mget parts join."""

from __future__ import annotations

from typing import Any

import pytest

from tenantkv import errors
from tenantkv.client.cluster import SlotMap, joined, plan, unrouted
from tenantkv.client.core import Call

DOC: dict[str, Any] = {
    "enabled": True,
    "version": 3,
    "ranges": [[0, 8191, "a"], [8192, 16383, "b"]],
    "nodes": {"a": {"host": "h", "port": 1}, "b": {"host": "h", "port": 2}},
}
A, B, SEED = ("h", 1), ("h", 2), ("seed", 9)


def mget(keys: list[bytes]) -> Call[Any]:
    return Call("mget", {"keys": keys}, lambda r: [None if x is None else x["v"] for x in r], True)


def test_slot_map_routes_by_slot() -> None:
    m = SlotMap(DOC)
    assert m.node_of(b"bar") == A and m.node_of(b"foo") == B  # slots 5061, 12182
    assert SlotMap({**DOC, "ranges": [[0, 100, "a"]]}).node_of(b"foo") is None
    with pytest.raises(errors.ClientError, match="not in a cluster"):
        SlotMap({"enabled": False})


def test_a_one_key_call_goes_whole_and_a_keyless_one_to_the_seed() -> None:
    m = SlotMap(DOC)
    get = Call("get", {"key": b"foo"}, lambda r: r)
    assert plan(get, m, SEED) == [(B, get, None)]
    ping = Call("ping", {}, lambda r: r)
    assert plan(ping, m, SEED) == [(SEED, ping, None)]
    same = mget([b"{foo}1", b"{foo}2"])
    assert plan(same, m, SEED) == [(B, same, None)]  # one node: not split
    assert joined(plan(same, m, SEED), [["x", "y"]]) == ["x", "y"]


def test_an_mget_over_nodes_is_split_and_joined_in_key_order() -> None:
    m = SlotMap(DOC)
    call = mget([b"foo", b"bar", b"{foo}x", b"{bar}y"])
    parts = plan(call, m, SEED)
    assert [(addr, p.params["keys"], pos) for addr, p, pos in parts] == [
        (B, [b"foo", b"{foo}x"], [0, 2]),
        (A, [b"bar", b"{bar}y"], [1, 3]),
    ]
    results = [p.parse([{"v": k} for k in p.params["keys"]]) for _, p, _ in parts]
    assert joined(parts, results) == [b"foo", b"bar", b"{foo}x", b"{bar}y"]


def test_a_slot_without_a_node_is_unavailable() -> None:
    with pytest.raises(errors.NodeUnavailable):
        unrouted(None, Call("get", {"key": b"k"}, lambda r: r))
