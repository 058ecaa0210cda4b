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
from tenantkv.server.redis_scan import (
    MAX_PATTERN_BYTES,
    PATTERN_UNIT_BYTES,
    compiled_glob,
    glob_matcher,
)

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
        (b"x[", [], [b"x[", b"x"]),  # Redis: an unclosed, empty class takes no byte
        (b"k[1-", [b"k1", b"k-"], [b"k2", b"k[1-"]),  # unclosed: the class to the end
        (b"[z-a]", [b"a", b"m", b"z"], [b"A", b"{"]),  # Redis swaps a reversed range's ends
        (b"[a-]x", [b"a", b"]", b"^", b"x"], [b"ax", b"-"]),  # a-] a range, the class open
        (b"a\\", [b"a\\"], [b"a"]),  # a trailing backslash is itself
        (b"[\\]]", [b"]"], [b"\\"]),
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


def redis_stringmatchlen(pattern: bytes, string: bytes) -> bool:
    """Redis's ``stringmatchlen`` (src/util.c, case-sensitive) written out plainly:
    the reference the matcher is held to. Indexes stand for C's pointers; a
    byte past the end reads as C's terminating NUL; ranges compare signed chars."""
    skip_longer = [False]

    def at(p: bytes, i: int) -> int:
        return p[i] if i < len(p) else 0

    def signed(c: int) -> int:
        return c - 256 if c >= 128 else c

    def impl(p: bytes, s: bytes, nesting: int) -> bool:
        if nesting > 1000:
            return False
        pi, plen, si, slen = 0, len(p), 0, len(s)
        while plen and slen:
            c = p[pi]
            if c == ord("*"):
                while plen and at(p, pi + 1) == ord("*"):
                    pi += 1
                    plen -= 1
                if plen == 1:
                    return True
                while slen:
                    if impl(p[pi + 1 :], s[si:], nesting + 1):
                        return True
                    if skip_longer[0]:
                        return False
                    si += 1
                    slen -= 1
                skip_longer[0] = True
                return False
            if c == ord("?"):
                si += 1
                slen -= 1
            elif c == ord("["):
                pi += 1
                plen -= 1
                negate = at(p, pi) == ord("^")
                if negate:
                    pi += 1
                    plen -= 1
                match = False
                while True:
                    if at(p, pi) == ord("\\") and plen >= 2:
                        pi += 1
                        plen -= 1
                        if p[pi] == s[si]:
                            match = True
                    elif at(p, pi) == ord("]"):
                        break
                    elif plen == 0:
                        pi -= 1
                        plen += 1
                        break
                    elif plen >= 3 and p[pi + 1] == ord("-"):
                        start, end = signed(p[pi]), signed(p[pi + 2])
                        if start > end:
                            start, end = end, start
                        pi += 2
                        plen -= 2
                        if start <= signed(s[si]) <= end:
                            match = True
                    elif p[pi] == s[si]:
                        match = True
                    pi += 1
                    plen -= 1
                if negate:
                    match = not match
                if not match:
                    return False
                si += 1
                slen -= 1
            else:
                if c == ord("\\") and plen >= 2:
                    pi += 1
                    plen -= 1
                if p[pi] != s[si]:
                    return False
                si += 1
                slen -= 1
            pi += 1
            plen -= 1
            if slen == 0:
                while at(p, pi) == ord("*"):
                    pi += 1
                    plen -= 1
                break
        return plen == 0 and slen == 0

    return impl(pattern, string, 0)


#: Bytes that mean something in a pattern, and a few that do not (a high one
#: too: ranges compare signed chars).
SPECIAL = b"*?[]^-\\ab\x00\xffzA\x80"
ALPHABET = st.sampled_from(list(SPECIAL))


@given(
    st.lists(ALPHABET, max_size=12).map(bytes),
    st.lists(st.sampled_from(list(b"ab]-^\\[*?z\x00\xff\x80")), min_size=1, max_size=10).map(bytes),
)
def test_it_answers_what_redis_answers(pattern: bytes, key: bytes) -> None:
    assert glob_matcher(pattern)(key) == redis_stringmatchlen(pattern, key)


@given(st.binary(max_size=40), st.binary(min_size=1, max_size=12))
def test_it_answers_what_redis_answers_for_any_bytes(pattern: bytes, key: bytes) -> None:
    assert glob_matcher(pattern)(key) == redis_stringmatchlen(pattern, key)


def test_compiling_is_linear_in_the_pattern_and_cached() -> None:
    """A class of random bytes as long as a pattern may be, fresh each time (16,000
    of them held the event loop 16-20 ms a pattern): compiling one costs its
    floors; a second use, in the same bucket, is a dictionary lookup that costs
    none (in another bucket, the floors again). What compiling takes is
    ``python -m bench micro``'s figure, not asserted here (CI machines are loaded)."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        body = bytes(rng.randrange(32, 127) for _ in range(MAX_PATTERN_BYTES - 2))
        pattern = b"[" + body + b"]"
        matcher, floors = compiled_glob("b1", pattern)
        assert floors == 1 + MAX_PATTERN_BYTES // PATTERN_UNIT_BYTES + pattern.count(b"[")
    assert compiled_glob("b1", pattern) == (matcher, 0)
    assert compiled_glob("b2", pattern)[1] == floors


def test_a_pattern_longer_than_any_key_matches_nothing_and_one_too_long_is_refused() -> None:
    assert not glob_matcher(b"?" * (protocol.MAX_KEY_BYTES + 1))(b"a" * protocol.MAX_KEY_BYTES)
    assert glob_matcher(b"?" * protocol.MAX_KEY_BYTES)(b"a" * protocol.MAX_KEY_BYTES)
    with pytest.raises(errors.BadValue, match="pattern longer than"):
        glob_matcher(b"*" * (MAX_PATTERN_BYTES + 1))
