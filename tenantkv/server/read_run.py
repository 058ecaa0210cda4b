"""A run of reads: the consecutive reads of one command in a connection's chunk,
admitted together.

The first read of a run passes every gate (:meth:`Pipeline.try_pass_read`);
each next read of the same command on the same bucket joins the run while the
costs so far stay below the run's throttle allowance
(:meth:`TenantThrottle.run_allowance`, asked by the second read: a run of one
needs none) — the answer every gate would give that read on its own, since
nothing else ran in between. The run is counted and charged once when it ends
(:meth:`ReadRun.end`). The chunk executor (``server/executor.py``) runs the
reads of a run in one loop; this object holds the run's figures.
"""

from __future__ import annotations

from tenantkv.server.commands import Command
from tenantkv.server.node import Node
from tenantkv.storage.engine import BucketHandle

#: A read run's allowance before its second read asks for it (costs are >= 0).
ASK_ALLOWANCE = -1.0


class ReadRun:
    """The reads of one run: their command and bucket, and what they cost."""

    __slots__ = (
        "allowance",
        "cmd",
        "cost",
        "errors",
        "floor",
        "handle",
        "reads",
        "ru",
        "unit",
        "unthrottled",
        "watched",
    )

    def __init__(self, cmd: Command, handle: BucketHandle, node: Node, unthrottled: bool) -> None:
        cfg = node.config
        self.cmd = cmd
        self.handle = handle
        self.unthrottled = unthrottled
        #: the read unit size and per-operation floor of units, as at the run's start
        self.unit = cfg.read_unit_size
        self.floor = cfg.min_op_units
        self.allowance = ASK_ALLOWANCE  # a run of one read never needs it
        #: reads admitted, those that failed, and their units and cost so far
        self.reads = 0
        self.errors = 0
        self.ru = 0
        self.cost = 0
        # Nobody can subscribe while the run lasts: it never awaits. (The core's
        # list, not a property: a call less per run.)
        self.watched = node.pipeline.queues_enabled and bool(node.queues.queues.subscribers)

    def covers(self, node: Node) -> bool:
        """Does the run's allowance cover one more read? Asked of the throttle
        (:meth:`TenantThrottle.run_allowance`) by the run's second read — the
        answer it had when the first read was admitted, since the run is charged
        only when it ends and nothing else ran."""
        if self.cost < self.allowance:
            return True
        if self.allowance != ASK_ALLOWANCE:
            return False
        self.allowance = node.throttle.run_allowance(self.handle.name, unthrottled=self.unthrottled)
        return self.cost < self.allowance

    def end(self, node: Node, now: float, served: dict[tuple[str, str], int]) -> None:
        """Count the run's reads through the gates and charge their units
        (at ``now``, the chunk's clock reading); add its operations served to
        the chunk's counts (``served``), which are timed with the chunk."""
        bucket = self.handle.name
        if self.reads > 1:  # the first was counted by try_pass_read
            node.pipeline.passed_reads(bucket, self.reads - 1)
        node.charge_reads(bucket, self.ru, self.cost, self.unthrottled, now)
        ok = self.reads - self.errors
        if ok:
            key = (bucket, self.cmd.name)
            served[key] = served.get(key, 0) + ok
