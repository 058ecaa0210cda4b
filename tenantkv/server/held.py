"""A request that waits before it is served or answered (sans-IO).

A filter of a chunk's requests puts a :class:`Held` in a request's place when
the request can be neither served nor refused yet: in a cluster, a request of
a slot that is moving away waits until the move settles
(:meth:`tenantkv.cluster.routing.Router.hold`). The executor awaits its
``settle`` before anything after it in the chunk, so replies keep their order.
A module of its own, imported by both, so the cluster's router and the
executor do not import each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class Held:
    """A request and the step that settles it: ``settle(executor)`` returns the
    request to serve, or None when it answered the request itself. Indexes as
    the request does (msgid, method, params)."""

    __slots__ = ("request", "settle")

    def __init__(self, request: Any, settle: Callable[[Any], Awaitable[Any]]) -> None:
        self.request = request
        self.settle = settle

    def __getitem__(self, i: int) -> Any:
        return self.request[i]
