"""The two login messages share their first fields through a base message: their
wire forms, positional construction and replies stay as they were."""

from __future__ import annotations

from tenantkv.server import control_messages as m


def test_login_begin_keeps_its_wire_form_and_reply() -> None:
    msg = m.LoginBegin(7, "10.0.0.1", "ann", True, [1.0, 2.0])
    assert msg.to_wire() == {
        "type": "login_begin",
        "login": 7,
        "source": "10.0.0.1",
        "user": "ann",
        "cached": True,
        "settings": [1.0, 2.0],
    }
    assert list(msg.to_wire()) == ["type", "login", "source", "user", "cached", "settings"]
    assert m.LoginBegin.from_wire(msg.to_wire()) == msg
    assert m.LoginBegin.REPLY is m.LoginBeginReply


def test_login_end_keeps_its_wire_form_and_reply() -> None:
    msg = m.LoginEnd(8, "10.0.0.2", None, False, [3.0])
    assert list(msg.to_wire()) == ["type", "login", "source", "user", "ok", "settings"]
    assert m.LoginEnd.from_wire(msg.to_wire()) == msg
    assert m.LoginEnd.REPLY is m.LoginEndReply


def test_the_shared_base_is_no_message() -> None:
    assert all(cls.__name__ != "_LoginStep" for cls in m.MESSAGES.values())
    assert m.MESSAGES["login_begin"] is m.LoginBegin and m.MESSAGES["login_end"] is m.LoginEnd
