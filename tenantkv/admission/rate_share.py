"""A node-wide rate limit shared by worker processes (sans-IO).

``serve --workers N`` keeps the front-door rate limiters node-wide (the ingress
request limiter, the connection-establishment limiter): each worker runs its
own token bucket at a *share* of the configured rate, and the shares always add
up to exactly the whole rate, so the node can never admit more than a single
process would. Every slice the supervisor re-splits each rate from what each
worker's clients attempted in the last slice:

- a worker gets what it asked for (with ``HEADROOM`` to grow) while the rate
  covers every worker's demand; the rest is spread evenly, so an idle worker
  can still admit its first requests at once;
- when demand exceeds the rate, the rate is water-filled: no worker gets more
  than it asked for, and the ones asking most share what the others leave;
- every worker keeps at least ``MIN_SHARE`` of an even split, so a client that
  lands on an idle worker is served within one slice, not starved by history.

The shares lag demand by one slice (100 ms); a token bucket's burst scales with
its rate, so the node's burst is also the configured one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tenantkv.admission.rate_allocation import water_fill

#: Demand is scaled by this before it caps a worker's share: room to grow.
HEADROOM: Final = 1.25
#: Every worker keeps this fraction of an even split.
MIN_SHARE: Final = 0.1


def split(rate: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Each worker's fraction of ``rate`` (they sum to 1) from its recent demand
    (what its clients attempted, per second, admitted or not)."""
    n = len(demands)
    if n == 0:
        return {}
    even = 1.0 / n
    floor = MIN_SHARE * even
    free = 1.0 - floor * n
    if rate <= 0.0:
        return dict.fromkeys(demands, even)
    # What each worker needs, as a fraction of the rate, beyond its floor.
    caps = [max(0.0, max(d, 0.0) * HEADROOM / rate - floor) for d in demands.values()]
    shares = water_fill(free, caps, [1.0] * n)
    rest = (free - sum(shares)) / n  # what nobody needs now: evenly, room to start
    return {name: floor + share + rest for name, share in zip(demands, shares, strict=True)}
