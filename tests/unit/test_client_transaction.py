"""``Client.transaction()``: one request, its results converted, and retried only
when the server proves it did not run (the shared retry policy, as a write)."""

from __future__ import annotations

from typing import Any

import pytest

import tenantkv
from tenantkv import errors
from tests.unit.test_client_retries import Cluster, FakeClient, always, fail_first, fixed

OPS = [("set", {"key": "a", "value": "1"}), ("incr", {"key": "text"})]
DONE = [{"result": {"cas": 5}}, {"error": errors.NotANumber("not an integer").to_wire()}]


def test_one_request_with_its_ops_and_watch_and_results_converted() -> None:
    c = FakeClient(Cluster(always(DONE)))
    got = c.transaction(OPS, watch={"a": 4, b"b": 0})
    assert got[0] == {"cas": 5} and isinstance(got[1], errors.NotANumber)
    ((_, params),) = c.cluster.sent("transaction")
    assert params["ops"] == [["set", {"key": "a", "value": "1"}], ["incr", {"key": "text"}]]
    assert params["watch"] == [[b"a", 4], [b"b", 0]]
    c.cluster.script = always(None)  # a watched key changed: nothing ran
    assert c.transaction(OPS, watch={"a": 4}) is None


def test_retried_when_the_server_proves_it_did_not_run() -> None:
    c = FakeClient(Cluster(fail_first(2, ok=DONE)))
    assert c.transaction(OPS)[0] == {"cas": 5}
    assert len(c.cluster.sent("transaction")) == 3
    off = tenantkv.RetryPolicy(retry_writes=False, random=fixed(0))
    c = FakeClient(Cluster(fail_first(1, ok=DONE)), retry_policy=off)
    with pytest.raises(errors.Throttled):
        c.transaction(OPS)
    assert len(c.cluster.sent("transaction")) == 1


@pytest.mark.parametrize(
    "error",
    [
        errors.ConnectionClosed("lost after sending"),
        errors.KeyNotFound("no"),
        errors.BadValue("ops[1] (set): 'value' must be bytes or a string"),
    ],
)
def test_never_retried_when_it_may_have_run_or_was_refused_for_what_it_asked(
    error: errors.TenantKVError,
) -> None:
    def script(i: int, m: str, p: dict[str, Any], n: int) -> Any:
        if isinstance(error, errors.ConnectionClosed):
            raise error  # the connection went down with the request sent
        return error.to_wire()

    c = FakeClient(Cluster(script))
    with pytest.raises(type(error)):
        c.transaction(OPS)
    assert len(c.cluster.sent("transaction")) == 1
