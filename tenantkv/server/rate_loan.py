"""A chunk's loan of request-rate tokens: the ingress request rate limiter,
decided once per received chunk (see :meth:`RateLoan.try_take`).

Most chunks hold one request (unpipelined clients): the first request takes
a token directly (:meth:`Pipeline.take_request_token`), as a loan would cost
a lend and a settle more. The next request — or the first, when no token was
there — borrows every token the limiter holds then
(:meth:`Pipeline.lend_request_tokens`); each request of the chunk then takes
one from the loan while one is left and is refused otherwise — all with the
same answer, as at the chunk's instant — and :meth:`RateLoan.settle` gives
back the rest and counts them when the chunk ends or anything awaits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tenantkv import errors
from tenantkv.admission.pipeline import Pipeline

#: A whole token of a request-rate loan (the token bucket's own float tolerance).
RATE_TOKEN = 1.0 - 1e-9
#: ``left`` once a chunk's first request took its token without a loan.
FIRST_TOKEN_TAKEN = -math.inf


class RateLoan:
    """One connection's loan for the chunk being handled (reused chunk to chunk)."""

    __slots__ = ("_peer", "_pipeline", "left", "lent", "refusal", "refused", "room")

    def __init__(self, pipeline: Pipeline, peer_ip: str) -> None:
        self._pipeline = pipeline
        self._peer = peer_ip
        #: the tokens lent (None: no loan; FIRST_TOKEN_TAKEN: the first request
        #: took its token without one)
        self.left: float | None = None
        #: the loan's whole tokens, and those not yet taken: a chunk loop may take
        #: one itself (``room -= 1``) instead of calling :meth:`try_take`
        self.lent = 0
        self.room = 0
        #: requests the loan refused, and the chunk's one refusal (its template)
        self.refused = 0
        self.refusal: errors.ServerError | None = None

    def try_take(self, now: Callable[[], float]) -> bool | None:
        """A token for the chunk's next request that is not exempt: True when it
        has one, False when the loan refuses it (:meth:`refusal_wait`), None when
        no loan applies (an exempt address: ask the limiter per request).
        ``now``: the chunk's reading of the throttle clock, asked only to lend."""
        left = self.left
        if left is None or left == FIRST_TOKEN_TAKEN:
            pipeline = self._pipeline
            at = now()
            if left is None and pipeline.take_request_token(self._peer, at):
                self.left = FIRST_TOKEN_TAKEN
                return True
            left = self.left = pipeline.lend_request_tokens(self._peer, at)
            if left is None:
                return None
            # Request j of the chunk passes when left - (j - 1) >= RATE_TOKEN.
            self.lent = self.room = max(0, int(left + (1.0 - RATE_TOKEN)))
        if self.room:
            self.room -= 1
            return True
        return False

    def refusal_wait(self) -> float:
        """Seconds until a request the loan refused could have a token."""
        assert self.left is not None
        return self._pipeline.request_limiter.wait_when(self.left - self.lent)

    def settle(self) -> int:
        """Give the chunk's unused tokens back and count its requests; the number
        it refused (for the caller to count as its bucket's errors)."""
        left = self.left
        refused = 0
        if left is not None:
            self.left = None
            if left != FIRST_TOKEN_TAKEN:  # (no loan to settle: a call less a chunk)
                refused = self.refused
                admitted = self.lent - self.room
                self._pipeline.request_limiter.settle(left - admitted, admitted, refused)
                self.lent = self.room = self.refused = 0
        return refused
