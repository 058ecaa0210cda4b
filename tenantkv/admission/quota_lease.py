"""Leased tenant quota: one bucket's rate shared by several consumers (sans-IO).

The groundwork of ``serve --workers N`` (issue 19): a bucket's limit is a promise
about the node, but each worker process sees only its own connections. As in
CockroachDB's distributed token bucket (RFC 20210604), a **global bucket** per
tenant lives in one place (:class:`QuotaServer`, the supervisor's) and each
worker keeps a **local bucket** (:class:`QuotaClient`) that asks for grants
ahead of need, one target period at a time, reporting what it consumed and
what waits. Nothing here does I/O or reads a clock: callers pass ``now`` and
carry the messages (:class:`GrantRequest`, :class:`Grant`) however they like,
so the same protocol can later run between nodes.

The rules, and why they keep the limit:

- The global bucket refills at ``rate`` up to ``burst`` and may lend ahead by
  at most ``LEND_PERIODS`` periods of refill. Over any interval the node admits
  at most ``burst + rate x (interval + 2 periods)`` — the ideal single bucket's
  bound plus 0.2 s of the rate, 2 % of a 10 s window at the default 100 ms.
- A grant is delivered at once while the global bucket is comfortably full, and
  as a **trickle** (tokens spread over the period) once it runs low, so a
  consumer cannot burn a large grant in a burst while the others starve.
- When the bucket cannot cover every request, each consumer gets its share of
  the refill since its own last grant — time-based, so asking first or often
  gains nothing — shared by **recent demand**: what each consumer's clients
  asked for per second, admitted or not, plus its waiting backlog drained over
  one period. (Sharing by what was consumed would feed back: the consumer that
  got more would ask for more.) Consumers whose requests stop (a worker that
  died) drop out of the shares after ``LEASE_PERIODS`` periods; whatever a dead
  consumer held is lost, never more than its last grant.
- A consumer returns what it holds beyond two periods of its own use with its
  next request, so idle workers do not sit on the node's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: How far ahead a consumer asks: one period of its use (CockroachDB uses 10 s
#: across nodes; workers on one machine can afford much shorter periods).
TARGET_PERIOD: Final = 0.1
#: A consumer that has not asked for this many periods drops out of the shares.
LEASE_PERIODS: Final = 3
#: The global bucket lends at most this many periods of refill ahead.
LEND_PERIODS: Final = 2
#: Below this fraction of the burst, grants trickle instead of arriving at once.
TRICKLE_BELOW: Final = 0.5
#: Weight of the newest period in a consumer's demand-rate average.
RATE_ALPHA: Final = 0.5


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """What a consumer asks for: who it is, its recent use and what waits."""

    consumer: str
    #: units asked for per second over the recent periods, admitted or not (a
    #: moving average): what its clients offer, the basis of its share
    demand_rate: float
    #: units of requests waiting for tokens now (a blocking queue)
    backlog: float = 0.0
    #: tokens it gives back (held beyond its need)
    returned: float = 0.0


@dataclass(frozen=True, slots=True)
class Grant:
    """The answer: ``tokens`` to add, at once or spread evenly until ``until``."""

    tokens: float
    #: when the tokens have all arrived (== the request time: at once)
    until: float


@dataclass(slots=True)
class _Consumer:
    demand: float = 0.0
    last_seen: float = 0.0
    #: when it was last granted from a scarce bucket (None: never)
    last_grant: float | None = None


@dataclass(slots=True)
class QuotaServer:
    """The global bucket of one tenant (see the module docstring)."""

    rate: float
    burst: float
    period: float = TARGET_PERIOD
    tokens: float = field(init=False)
    updated: float = 0.0
    consumers: dict[str, _Consumer] = field(default_factory=dict)
    #: every token granted so far (the accounting tests check)
    granted_total: float = 0.0

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def request(self, req: GrantRequest, now: float) -> Grant:
        self._refill(now)
        self.tokens = min(self.burst, self.tokens + max(req.returned, 0.0))
        c = self.consumers.setdefault(req.consumer, _Consumer())
        c.demand = max(req.demand_rate, 0.0) + max(req.backlog, 0.0) / self.period
        c.last_seen = now
        since = self.period if c.last_grant is None else now - c.last_grant
        c.last_grant = now
        wanted = c.demand * self.period
        if wanted <= 0.0:
            return Grant(0.0, now)
        if self.tokens - wanted >= TRICKLE_BELOW * self.burst:
            tokens, until = wanted, now  # plenty: all of it, at once
        else:
            # Scarce: this consumer's share (by demand) of the refill since its
            # last grant, and of what the bucket still holds, spread over the
            # period. Time-based, so neither asking first nor asking often gets
            # more: the shares of the refill add up to the rate.
            total = sum(
                x.demand
                for x in self.consumers.values()
                if now - x.last_seen <= LEASE_PERIODS * self.period
            )
            share = c.demand / total if total > 0.0 else 1.0
            accrued = self.rate * min(since, LEASE_PERIODS * self.period)
            tokens = (max(self.tokens, 0.0) + accrued) * share
            # Lending ahead stays bounded: at most LEND_PERIODS of refill.
            floor = -LEND_PERIODS * self.rate * self.period
            tokens = max(0.0, min(tokens, wanted, self.tokens - floor))
            until = now + self.period
        self.tokens -= tokens
        self.granted_total += tokens
        return Grant(tokens, until)

    def forget(self, consumer: str) -> None:
        """A consumer is gone for good (a worker that exited)."""
        self.consumers.pop(consumer, None)

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + self.rate * (now - self.updated))
            self.updated = now


@dataclass(slots=True)
class QuotaClient:
    """One consumer's local bucket: admits while it holds tokens, asks ahead."""

    name: str
    period: float = TARGET_PERIOD
    tokens: float = 0.0
    #: a trickle in progress: tokens/s arriving until ``trickle_until``
    trickle_rate: float = 0.0
    trickle_until: float = 0.0
    updated: float = 0.0
    #: units asked for per second, admitted or not (a moving average)
    demand_rate: float = 0.0
    #: units waiting for tokens now (a caller with a blocking queue sets it)
    backlog: float = 0.0
    in_flight: bool = False
    next_request: float = 0.0
    _asked: float = 0.0
    _window_start: float = 0.0

    def try_spend(self, units: float, now: float) -> bool:
        """Admit ``units`` if tokens are left (it may overdraw, as the throttle's
        optimistic admission does: the next grants pay it back); else say no.
        Either way the units count as demand."""
        self._advance(now)
        self._asked += units
        if self.tokens > 0.0:
            self.tokens -= units
            return True
        return False

    def wants_grant(self, now: float) -> bool:
        """Time to ask: tokens for less than one period of use, or the period is over."""
        self._advance(now)
        if self.in_flight or self.trickle_until - now > 0.2 * self.period:
            return False  # a trickle is still arriving: ask again near its end
        low = self.tokens < self.demand_rate * self.period or self.tokens <= 0.0
        return low or now >= self.next_request

    def make_request(self, now: float) -> GrantRequest:
        self._advance(now)
        self.in_flight = True
        # What this window already asked for counts, as a rate over one period (a
        # consumer that just started has no average yet but does have demand).
        demand = max(self.demand_rate, self._asked / self.period)
        keep = 2 * demand * self.period
        returned = self.tokens - keep if self.tokens > keep else 0.0
        self.tokens -= returned
        return GrantRequest(self.name, demand, self.backlog, returned)

    def apply(self, grant: Grant, now: float) -> None:
        self._advance(now)
        self.in_flight = False
        self.next_request = now + self.period
        if grant.until <= now:
            self.tokens += grant.tokens
        else:
            # Whatever of an earlier trickle is still to come stays owed.
            owed = self.trickle_rate * max(self.trickle_until - now, 0.0)
            self.trickle_rate = (grant.tokens + owed) / (grant.until - now)
            self.trickle_until = grant.until

    def _advance(self, now: float) -> None:
        if now <= self.updated:
            return
        if self.trickle_until > self.updated:
            upto = min(now, self.trickle_until)
            self.tokens += self.trickle_rate * (upto - self.updated)
        self.updated = now
        if now - self._window_start >= self.period:
            rate = self._asked / (now - self._window_start)
            self.demand_rate += RATE_ALPHA * (rate - self.demand_rate)
            self._asked = 0.0
            self._window_start = now
