"""A control message is declared by its class line and docstring: what that
derives (wire type, sender, meaning, reply, the table of messages) and what it
refuses."""

from __future__ import annotations

import dataclasses

import pytest

from tenantkv.server import control_messages as m


def test_the_class_line_gives_type_sender_meaning_and_reply() -> None:
    assert m.Usage.TYPE == "usage" and m.Usage.SENDER == m.WORKER
    assert m.Usage.REPLY is m.UsageReply and m.Refresh.REPLY is m.Done
    assert m.Invalidate.MEANING == (
        "client-side caching: the keys a commit changed, [bucket, keys or nil for all]; "
        "answered once pushed, before the write is"
    )
    assert m.MESSAGES["invalidate"] is m.Invalidate
    assert list(m.MESSAGES)[:2] == ["init", "refresh"]  # (the order declared)
    msg = m.Evict(7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.conn = 8  # type: ignore[misc]
    assert m.ConnAdmitReply(True) == m.ConnAdmitReply(ok=True, evict=None, reason="")


def test_a_message_without_a_docstring_a_new_type_or_a_sender_is_refused() -> None:
    before = dict(m.MESSAGES)
    with pytest.raises(TypeError, match="'evict'"):

        class Again(m.ControlMessage, type="evict", sender=m.SUPERVISOR):
            """a second evict"""

    with pytest.raises(TypeError, match="'undocumented'"):

        class Undocumented(m.ControlMessage, type="undocumented", sender=m.WORKER):
            conn: int

    with pytest.raises(TypeError, match="'nobody'"):

        class Nobody(m.ControlMessage, type="nobody", sender="client"):
            """sent by no side of the channel"""

    with pytest.raises(TypeError, match="class line"):

        class InTheBody(m.ControlMessage):
            """a type given as an attribute is not a declaration"""

            TYPE = "in_the_body"

    assert dict(m.MESSAGES) == before
