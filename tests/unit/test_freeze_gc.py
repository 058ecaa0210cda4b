"""A serving process's garbage collector (``freeze_gc``): the frozen objects are
counted when they freeze, so the status document does not walk them each read."""

from __future__ import annotations

import gc

from tenantkv.server import status
from tenantkv.server.server import GC_YOUNG_THRESHOLD, freeze_gc


def test_freeze_gc_counts_what_it_froze_once() -> None:
    thresholds = gc.get_threshold()
    try:
        freeze_gc()
        counted = status._frozen.count
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        # A frozen object that dies leaves the permanent generation and nothing
        # joins it without another freeze: the count taken when it froze is the
        # count now plus the few objects that died since (2 in a run seen).
        assert frozen <= counted <= frozen + 100
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        status._frozen.count = 0
