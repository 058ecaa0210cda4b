"""The login limiter without a socket (auth.LoginLimiter, docs/security.md "Logins"):
delays per (user, address) that never lock out neighbours, known-good pairs, and
the node's scrypt pool with its bounded lanes. Time is a plain mock clock."""

from __future__ import annotations

import pytest

from tenantkv.server import auth

S = auth.LoginSettings(
    failure_limit=10,
    window_secs=60.0,
    delay_secs=0.1,
    delay_max_secs=5.0,
    hash_concurrency=2,
    hash_queue=4,
    hash_per_address=2,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fail(lim: auth.LoginLimiter, source: str, user: str | None) -> auth.LoginEnd:
    start = lim.begin(source, user, S)
    assert start.status == "run", start
    return lim.end(start.ticket, source, user, False, S)


def succeed(lim: auth.LoginLimiter, source: str, user: str) -> auth.LoginEnd:
    start = lim.begin(source, user, S)
    assert start.status == "run", start
    return lim.end(start.ticket, source, user, True, S)


def test_a_failure_is_held_for_a_growing_delay_and_refuses_only_its_pair() -> None:
    clock = Clock()
    lim = auth.LoginLimiter(clock)
    holds = []
    for _ in range(8):
        end = fail(lim, "10.0.0.1", "mallory")
        holds.append(end.hold)
        # meanwhile that pair is refused up front, with the time left as its hint
        refused = lim.begin("10.0.0.1", "mallory", S)
        assert (refused.status, refused.reason) == ("refused", "delay")
        assert refused.retry_after == pytest.approx(end.hold)
        # ...and nobody else is: another user at the address, the user elsewhere
        for source, user in (("10.0.0.1", "alice"), ("10.0.0.2", "mallory")):
            other = lim.begin(source, user, S)
            assert other.status == "run"
            lim.cancel(other.ticket, S)
        clock.t += end.hold  # a client that waits its answer is never refused
    assert holds == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert lim.begin("10.0.0.1", "mallory", S).status == "run"


def test_failures_are_forgotten_a_window_after_the_last() -> None:
    clock = Clock()
    lim = auth.LoginLimiter(clock)
    for _ in range(5):
        clock.t += fail(lim, "10.0.0.1", "bob").hold
    clock.t += 61
    assert fail(lim, "10.0.0.1", "bob").hold == pytest.approx(0.1)
    assert lim.statistics(S).tracked_pairs == 1


def test_an_address_guessing_many_names_is_held_longer_but_locks_no_one_out() -> None:
    clock = Clock()
    lim = auth.LoginLimiter(clock)
    holds = [fail(lim, "10.0.0.9", f"user{i}").hold for i in range(6)]
    assert holds == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2])  # the address's count
    # A user new at that address, with the right password: not refused, not held.
    start = lim.begin("10.0.0.9", "carol", S)
    assert start.status == "run"
    assert lim.end(start.ticket, "10.0.0.9", "carol", True, S).hold == 0


def test_a_known_good_pair_is_never_refused_and_goes_first() -> None:
    clock = Clock()
    lim = auth.LoginLimiter(clock)
    assert succeed(lim, "10.0.0.1", "admin").persist  # a new pair: write it down
    assert not succeed(lim, "10.0.0.1", "admin").persist  # written a moment ago
    assert lim.known_good("10.0.0.1", "admin")
    # Guesses at the admin from elsewhere do not touch its address.
    for _ in range(10):
        clock.t += fail(lim, "10.0.0.66", "admin").hold
    assert lim.begin("10.0.0.1", "admin", S, cached=True).status == "cached"
    # The pool is full of strangers' logins: the admin runs at once, in the slot
    # kept for known-good pairs.
    held = [lim.begin(f"10.1.0.{i}", f"u{i}", S) for i in range(6)]
    assert [h.status for h in held] == ["run", "run", "queued", "queued", "queued", "queued"]
    assert lim.begin("10.1.0.99", "u99", S).reason == "busy"  # the lane is full
    admin = lim.begin("10.0.0.1", "admin", S)
    assert admin.status == "run"
    end = lim.end(held[0].ticket, "10.1.0.0", "u0", False, S)
    assert end.granted == ()  # the known slot's hash still runs: 3 = 2 + 1
    # A failure at the pair ends its standing until its next success.
    assert lim.end(admin.ticket, "10.0.0.1", "admin", False, S).hold > 0
    assert not lim.known_good("10.0.0.1", "admin")
    clock.t += 8 * 86400
    assert not lim.known_good("10.0.0.66", "admin")


def test_the_hash_pool_bounds_each_address_and_serves_addresses_in_turn() -> None:
    lim = auth.LoginLimiter(Clock())
    a = [lim.begin("10.0.0.1", f"x{i}", S) for i in range(4)]
    assert [x.status for x in a] == ["run", "run", "refused", "refused"]
    assert a[2].reason == "busy" and a[2].retry_after > 0
    b = [lim.begin("10.0.0.2", f"y{i}", S) for i in range(2)]
    c = lim.begin("10.0.0.3", "z", S)
    assert [x.status for x in (*b, c)] == ["queued", "queued", "queued"]
    # One slot frees: address .2 is served, then .3 before .2's second login.
    first = lim.end(a[0].ticket, "10.0.0.1", "x0", False, S).granted
    second = lim.end(a[1].ticket, "10.0.0.1", "x1", False, S).granted
    assert (first, second) == ((b[0].ticket,), (c.ticket,))
    # A login that leaves while waiting frees its place; one running frees its slot.
    assert lim.cancel(b[1].ticket, S) == ()
    assert lim.cancel(b[0].ticket, S) == ()
    st = lim.statistics(S)
    assert (st.hashes, st.hashing, st.queued, st.refused_busy) == (4, 1, 0, 2)


def test_concurrent_guesses_for_one_pair_reach_scrypt_once() -> None:
    lim = auth.LoginLimiter(Clock())
    starts = [lim.begin("10.0.0.1", "victim", S) for _ in range(300)]
    assert [s.status for s in starts].count("run") == 1
    assert lim.statistics(S).hashes == 1


def test_limit_zero_turns_delays_off_but_not_the_pool() -> None:
    off = auth.LoginSettings(failure_limit=0, hash_concurrency=1, hash_queue=0)
    lim = auth.LoginLimiter(Clock())
    start = lim.begin("10.0.0.1", "u", off)
    assert lim.end(start.ticket, "10.0.0.1", "u", False, off).hold == 0
    assert lim.begin("10.0.0.1", "u", off).status == "run"
    assert lim.begin("10.0.0.2", "v", off).reason == "busy"


def test_known_good_pairs_load_from_their_ages_and_state_is_bounded() -> None:
    clock = Clock()
    lim = auth.LoginLimiter(clock, max_tracked=50)
    lim.load_known_good([("admin", "10.0.0.1", 3600.0), ("old", "10.0.0.2", 8 * 86400.0)])
    assert lim.known_good("10.0.0.1", "admin") and not lim.known_good("10.0.0.2", "old")
    for i in range(5000):
        clock.t += 0.001
        fail(lim, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", f"user{i}")
        succeed(lim, f"10.9.{i // 256 % 256}.{i % 256}", f"user{i}")
    st = lim.statistics(S)
    assert st.tracked_sources <= 50 and st.tracked_pairs <= 50 and st.known_good_pairs <= 50


def test_the_limit_is_reported_once_per_address() -> None:
    lim = auth.LoginLimiter(Clock())
    small = auth.LoginSettings(failure_limit=3, delay_secs=0.0)
    limited = []
    for i in range(6):
        start = lim.begin("10.0.0.1", f"u{i}", small)
        limited.append(lim.end(start.ticket, "10.0.0.1", f"u{i}", False, small).limited)
    assert limited == [False, False, True, False, False, False]


def test_login_source_groups_ipv6_by_64() -> None:
    assert auth.login_source("2001:db8:1:2:aaaa::1") == auth.login_source("2001:db8:1:2::ffff")
    assert auth.login_source("2001:db8:1:3::1") != auth.login_source("2001:db8:1:2::1")
    assert auth.login_source("::ffff:192.0.2.1") == "192.0.2.1"
    assert auth.login_source("192.0.2.1") == "192.0.2.1"


def test_new_user_names_may_not_hold_an_at_sign() -> None:
    assert auth.validate_user_name("a.b-c_d") == "a.b-c_d"
    with pytest.raises(Exception, match="'@' is not allowed"):
        auth.validate_user_name("ann@example")


def test_a_known_pair_has_one_login_in_the_first_lane_at_a_time() -> None:
    """A tenant guessing at its own known pair gains no priority over neighbours."""
    lim = auth.LoginLimiter(Clock())
    succeed(lim, "10.0.0.1", "mallory")
    succeed(lim, "10.0.0.1", "alice")
    busy = [lim.begin("10.2.0.1", "x", S), lim.begin("10.2.0.2", "y", S)]  # the pool is full
    first = lim.begin("10.0.0.1", "mallory", S)  # the slot kept for known pairs
    second = lim.begin("10.0.0.1", "mallory", S)  # the other lane, at the address's share
    alice = lim.begin("10.0.0.1", "alice", S)
    assert [first.status, second.status, alice.status] == ["run", "queued", "queued"]
    granted = lim.end(busy[0].ticket, "10.2.0.1", "x", False, S).granted
    assert granted == (alice.ticket,)  # first lane, before `second`
    assert lim.end(busy[1].ticket, "10.2.0.2", "y", False, S).granted == ()
    assert lim.end(first.ticket, "10.0.0.1", "mallory", False, S).granted == (second.ticket,)
