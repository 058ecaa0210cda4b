"""The request pre-check's table of MessagePack headers from 0xc0 on, built by
family: each family's widths land on the headers the specification gives them."""

from __future__ import annotations

from tenantkv.protocol import _HEADERS


def test_every_header_from_0xc0_is_known() -> None:
    assert sorted(_HEADERS) == list(range(0xC0, 0x100))


def test_each_family_has_its_widths() -> None:
    assert [_HEADERS[b] for b in (0xC4, 0xC5, 0xC6)] == [(0, n, "body") for n in (1, 2, 4)]
    assert [_HEADERS[b] for b in (0xC7, 0xC8, 0xC9)] == [(0, n, "ext") for n in (1, 2, 4)]
    assert [_HEADERS[b] for b in (0xCA, 0xCB)] == [(4, 0, "body"), (8, 0, "body")]
    for first in (0xCC, 0xD0):  # uint, int 8..64
        assert [_HEADERS[first + i] for i in range(4)] == [(n, 0, "body") for n in (1, 2, 4, 8)]
    assert {_HEADERS[b] for b in range(0xD4, 0xD9)} == {(0, 0, "ext")}
    assert [_HEADERS[b] for b in (0xD9, 0xDA, 0xDB)] == [(0, n, "body") for n in (1, 2, 4)]
    assert [_HEADERS[b] for b in (0xDC, 0xDD, 0xDE, 0xDF)] == [
        (0, 2, "container"),
        (0, 4, "container"),
    ] * 2
    assert _HEADERS[0xC1] == (0, 0, "bad")
    assert {_HEADERS[b] for b in (0xC0, 0xC2, 0xC3, *range(0xE0, 0x100))} == {(0, 0, "scalar")}
