"""KEYS / SCAN MATCH globs: Redis's semantics, in time linear in key times pattern.

A regex translation (``*`` as ``.*``) backtracks exponentially in Python's
``re``: ``*a*a*a*a*a*a*a*b`` against 60 bytes of ``a`` held the event loop for
seconds, for every tenant. The matcher must answer such a pattern at once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenantkv import errors, protocol
from tenantkv.server.redis_commands import MAX_PATTERN_BYTES, glob_matcher

# Pattern pieces: literals, wildcards, classes, escapes.
PIECES = ["a", "b", "*", "?", "[ab]", "[^a]", "[a-b]", "\\*", "\\a", "**"]


ANY = frozenset(range(256))


def tokens(pattern: bytes) -> list[frozenset[int] | None]:
    """The reference's reading of the pieces above: the bytes each position
    takes (None: a star)."""
    out: list[frozenset[int] | None] = []
    text = pattern.decode()
    i = 0
    while i < len(text):
        if text[i] == "*":
            out.append(None)
        elif text[i] == "?":
            out.append(ANY)
        elif text[i] == "\\":
            i += 1
            out.append(frozenset(text[i].encode()))
        elif text[i] == "[":
            j = text.index("]", i)
            body = text[i + 1 : j]
            neg = body.startswith("^")
            body = body[1:] if neg else body
            if len(body) == 3 and body[1] == "-":
                members = frozenset(range(ord(body[0]), ord(body[2]) + 1))
            else:
                members = frozenset(body.encode())
            out.append(ANY - members if neg else members)
            i = j
        else:
            out.append(frozenset(text[i].encode()))
        i += 1
    return out


def reference(pattern: bytes, key: bytes) -> bool:
    """Every way a star could split the key, remembered (small inputs only)."""
    toks = tokens(pattern)

    @cache
    def m(t: int, k: int) -> bool:
        if t == len(toks):
            return k == len(key)
        tok = toks[t]
        if tok is None:
            return m(t + 1, k) or (k < len(key) and m(t, k + 1))
        return k < len(key) and key[k] in tok and m(t + 1, k + 1)

    return m(0, 0)


@given(
    st.lists(st.sampled_from(PIECES), max_size=8).map(lambda p: "".join(p).encode()),
    st.lists(st.sampled_from([b"a", b"b", b"*"]), max_size=10).map(b"".join),
)
def test_it_matches_what_the_glob_means(pattern: bytes, key: bytes) -> None:
    assert glob_matcher(pattern)(key) == reference(pattern, key)


@pytest.mark.parametrize(
    ("pattern", "hits", "misses"),
    [
        (b"user:*", [b"user:", b"user:1"], [b"use", b"xuser:1"]),
        (b"*:1?0", [b"user:100", b"o:1x0"], [b"user:10", b"user:1000"]),
        (b"a*b*c", [b"abc", b"a-b-c", b"abcbc"], [b"acb", b"ab", b"abcx"]),
        (b"*ab*ab*", [b"abab", b"xabyabz"], [b"aba", b"ab"]),
        (b"h[^e]llo", [b"hallo"], [b"hello", b"hllo"]),
        (b"h[a-b]llo", [b"hallo", b"hbllo"], [b"hcllo"]),
        (b"[^]", [b"x", b"]"], [b"", b"xy"]),  # Redis: [^] is any one byte
        (b"a[]", [], [b"a", b"a]", b"a["]),
        (b"\\*x", [b"*x"], [b"ax"]),
        (b"x[", [b"x["], [b"x"]),  # an unclosed class is a literal "["
        (b"a\nb*", [b"a\nb", b"a\nbc"], [b"ab"]),  # a newline is a byte like any other
    ],
)
def test_redis_patterns(pattern: bytes, hits: list[bytes], misses: list[bytes]) -> None:
    matches = glob_matcher(pattern)
    assert [k for k in hits if not matches(k)] == []
    assert [k for k in misses if matches(k)] == []


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a backtracking matcher would take years here)."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_patterns_that_backtrack_in_a_regex_answer_at_once() -> None:
    with within(10):
        assert not glob_matcher(b"*a*a*a*a*a*a*a*b")(b"a" * 60)
        longest = b"a" * protocol.MAX_KEY_BYTES
        assert not glob_matcher(b"*a" * 40 + b"*b")(longest)
        assert not glob_matcher(b"*?" * 100 + b"*b")(longest)
        assert glob_matcher(b"*a" * 40 + b"*")(longest)


def test_a_pattern_longer_than_any_key_matches_nothing_and_one_too_long_is_refused() -> None:
    assert not glob_matcher(b"?" * (protocol.MAX_KEY_BYTES + 1))(b"a" * protocol.MAX_KEY_BYTES)
    assert glob_matcher(b"?" * protocol.MAX_KEY_BYTES)(b"a" * protocol.MAX_KEY_BYTES)
    with pytest.raises(errors.BadValue, match="pattern longer than"):
        glob_matcher(b"*" * (MAX_PATTERN_BYTES + 1))
