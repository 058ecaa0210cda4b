"""Execution tickets around real LMDB work, seen through server_status and parameters."""

from __future__ import annotations

import pytest

from tenantkv import errors
from tests.conftest import Daemon


def test_tickets_are_taken_and_released_around_storage(daemon: Daemon) -> None:
    with daemon.client() as c:
        before = c.server_status()["execution"]
        c.create_bucket("exe")
        c.select_bucket("exe")
        with c.pipeline() as p:
            for i in range(200):
                p.set(f"k{i}", b"v")
        assert c.mget([f"k{i}" for i in range(10)])[0] == b"v"
        for i in range(50):
            c.get(f"k{i}")
        after = c.server_status()["execution"]
    read, write = after["read"], after["write"]
    assert read["finished_processing"] - before["read"]["finished_processing"] == 51
    assert write["finished_processing"] - before["write"]["finished_processing"] == 200
    for pool in (read, write):
        assert pool["out"] == 0 and pool["processing"] == 0 and pool["queue_length"] == 0
        assert pool["total_tickets"] >= 4
    # admin work (create_bucket) is exempt: counted apart, never from the pool
    assert write["exempt"]["finished_processing"] > before["write"]["exempt"]["finished_processing"]
    probing = after["probing"]
    assert probing["state"] in ("stable", "up", "down")
    assert probing["read_concurrency"] == read["total_tickets"]
    assert probing["write_concurrency"] == write["total_tickets"]


def test_fixed_pool_sizes_turn_probing_off(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.command("set_parameter", name="storage_engine_concurrent_write_transactions", value=7)
        try:
            ex = c.server_status()["execution"]
            assert ex["write"]["total_tickets"] == 7
            assert ex["probing"]["state"] == "fixed"
        finally:
            c.command(
                "set_parameter", name="storage_engine_concurrent_write_transactions", value=None
            )


@pytest.mark.parametrize(
    "name, value",
    [
        ("throughput_probing_step_multiple", 0.9),
        ("throughput_probing_max_step_multiple", 4.5),
        ("throughput_probing_concurrency_moving_average_weight", 0),
        ("throughput_probing_concurrency_adjustment_interval_ms", 5),
        ("throughput_probing_min_concurrency", 1000),  # above max: the cross-check refuses it
    ],
)
def test_probing_parameters_are_range_checked(daemon: Daemon, name: str, value: object) -> None:
    with daemon.client() as c:
        before = c.command("get_parameter", name=name)["value"]
        with pytest.raises(errors.BadValue, match=name.split("_")[-1]):
            c.command("set_parameter", name=name, value=value)
        assert c.command("get_parameter", name=name)["value"] == before


def test_probing_boost_is_a_runtime_parameter(daemon: Daemon) -> None:
    name = "throughput_probing_max_step_multiple"
    with daemon.client() as c:
        assert c.command("get_parameter", name=name)["value"] == 1.0
        c.command("set_parameter", name=name, value=0.1)  # boost off: MongoDB's probing
        assert c.command("get_parameter", name=name)["value"] == 0.1
        probing = c.server_status()["execution"]["probing"]
        assert {"streak", "streak_direction", "last_step_multiple"} <= probing.keys()
        c.command("set_parameter", name=name, value=None)
        assert c.command("get_parameter", name=name)["value"] == 1.0
