"""A MessagePack client on the RESP port: the RESP decoder names the MessagePack
port at once, and the client turns the Redis protocol's answer into words."""

from __future__ import annotations

import msgpack
import pytest

from tenantkv import errors, protocol
from tenantkv.client.core import ClientCore
from tenantkv.server.doors import resp

HELLO = protocol.encode_request(1, "hello", {"user": "admin", "password": "pw"})


def test_resp_decoder_refuses_a_messagepack_frame_and_names_the_port() -> None:
    dec = resp.RequestDecoder(max_bulk_bytes=1024, max_frame_bytes=4096, msgpack_port=7207)
    dec.feed(HELLO)
    with pytest.raises(errors.ProtocolError, match=r"talk to the MessagePack port 7207$"):
        list(dec)


def test_resp_decoder_still_takes_commands_and_inline_lines() -> None:
    dec = resp.RequestDecoder(max_bulk_bytes=1024, max_frame_bytes=4096, msgpack_port=7207)
    dec.feed(b"*1\r\n$4\r\nPING\r\nGET k\r\n")
    assert list(dec) == [[b"PING"], [b"GET", b"k"]]
    # only a connection's first bytes are judged so: later ones are an inline line
    dec.feed(bytes([0x94]) + b" x\r\n")
    assert list(dec) == [[bytes([0x94]), b"x"]]


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (
            b"-ERR Protocol error: this is the RESP (Redis protocol) port; tenantkv-admin "
            b"and tenantkv.Client talk to the MessagePack port 7300\r\n",
            "talk to the MessagePack port 7300",
        ),
        # a server that does not name its port: its line is quoted
        (
            b"-ERR no hello within hello_timeout_secs\r\n",
            "talk to the MessagePack port (it answered 'ERR no hello within hello_timeout_secs')",
        ),
    ],
)
def test_client_core_recognises_a_resp_answer(reply: bytes, said: str) -> None:
    core = ClientCore()
    with pytest.raises(errors.MalformedReply) as info:
        core.receive(reply)
    assert str(info.value.errmsg).startswith("this looks like the RESP (Redis protocol) port; ")
    assert info.value.errmsg.endswith(said)


def test_client_core_takes_messagepack_replies_as_before() -> None:
    core = ClientCore()
    wire = msgpack.packb([protocol.RESPONSE, 1, None, "pong"])
    assert [r.result for r in core.receive(wire[:2])] == []
    assert [r.result for r in core.receive(wire[2:])] == ["pong"]
