"""The control channel of ``serve --workers N``: every message typed, in one
table in the docs, and dispatched by one table on each side."""

from __future__ import annotations

import dataclasses
import pathlib

import msgpack
import pytest
import trio
import trio.lowlevel
import trio.testing

from tenantkv.server import control_messages as m
from tenantkv.server.control import Channel, RemoteError
from tenantkv.server.supervisor import Supervisor
from tenantkv.server.worker import WorkerLink

DOC = pathlib.Path(__file__).parents[2] / "docs" / "scaling.md"


def _doc_rows() -> list[list[str]]:
    text = DOC.read_text().split("## The control channel", 1)[1]
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


def test_the_docs_table_lists_every_message_as_the_code_has_it() -> None:
    assert _doc_rows() == m.message_table()


def test_each_side_handles_every_message_the_other_sends() -> None:
    assert set(Supervisor.HANDLERS) == m.sent_by(m.WORKER)
    assert set(WorkerLink.HANDLERS) == m.sent_by(m.SUPERVISOR)
    assert len(m.MESSAGES) == 20


@pytest.mark.parametrize("cls", list(m.MESSAGES.values()), ids=lambda c: c.TYPE)
def test_a_message_survives_its_wire_form(cls: type[m.ControlMessage]) -> None:
    msg = cls(**{f.name: f"<{f.name}>" for f in dataclasses.fields(cls)})
    wire = msg.to_wire()
    assert wire["type"] == cls.TYPE
    assert m.decode(wire) == msg
    if issubclass(cls, m.Call):
        reply = cls.REPLY(**{f.name: 1 for f in dataclasses.fields(cls.REPLY)})
        assert cls.REPLY.from_wire(reply.to_wire()) == reply


def test_a_message_without_its_fields_is_malformed() -> None:
    with pytest.raises(m.MalformedMessage):
        m.decode({"type": "evict"})
    with pytest.raises(m.MalformedMessage):
        m.decode({"type": "no such message"})


async def test_a_call_is_answered_by_its_handler_and_a_failure_reaches_the_caller() -> None:
    left, right = trio.testing.memory_stream_pair()
    supervisor, worker = Channel(left, "supervisor"), Channel(right, "worker")
    evicted: list[int] = []

    async def on_status(msg: m.Status) -> m.StatusReply:
        return m.StatusReply({"pid": 7}, 1.5)

    async def on_evict(msg: m.Evict) -> None:
        evicted.append(msg.conn)

    async def on_refresh(msg: m.Refresh) -> m.Done:
        raise RuntimeError("storage gone")

    dispatch = {m.Status: on_status, m.Evict: on_evict, m.Refresh: on_refresh}
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run, dispatch)
            nursery.start_soon(supervisor.run, {})
            answer = await supervisor.call(m.Status())
            assert answer == m.StatusReply({"pid": 7}, 1.5)
            await supervisor.send(m.Evict(42))
            with pytest.raises(RemoteError, match="storage gone"):
                await supervisor.call(m.Refresh())
            with pytest.raises(RemoteError, match="not sent to this side"):
                await supervisor.call(m.NodeStatus())
            assert evicted == [42]
            nursery.cancel_scope.cancel()


async def test_handlers_begin_in_the_order_their_messages_arrived() -> None:
    """Each message runs in a task of its own, but its handler begins (runs up to
    its first checkpoint) in arrival order: a worker's write messages reach the
    node's writer in the order it sent them — Trio starts a batch of new tasks in
    no set order, which once applied a connection's later writes first."""
    left, right = trio.testing.memory_stream_pair()
    receiver = Channel(right, "supervisor")
    begun: list[int] = []
    all_begun = trio.Event()

    async def on_evict(msg: m.Evict) -> None:
        begun.append(msg.conn)  # (before any checkpoint: as a write's submit is)
        if len(begun) == 200:
            all_begun.set()
        await trio.lowlevel.checkpoint()

    wires = b"".join(msgpack.packb(m.Evict(i).to_wire()) for i in range(200))
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver.run, {m.Evict: on_evict})
            await left.send_all(wires)  # (all in one chunk: their tasks start together)
            await all_begun.wait()
            nursery.cancel_scope.cancel()
    assert begun == list(range(200))
