"""The read handlers a transaction may queue, registered by door for the writer
that runs them (:func:`tenantkv.storage.transaction_ops.read_handler` imports
this module on first use: in the node's writer process too, with
``serve --workers N``, where no connection ever loaded the command tables).
"""

from __future__ import annotations

from tenantkv.server import commands, redis_commands
from tenantkv.storage.transaction_ops import READ_HANDLERS


def register() -> None:
    """Every read command of both doors, as ``msgpack:<name>`` / ``resp:<name>``."""
    for name, cmd in commands.COMMANDS.items():
        if cmd.kind == "read":
            READ_HANDLERS[f"msgpack:{name}"] = cmd.handler
    for name, rc in redis_commands.REDIS_COMMANDS.items():
        if rc.kind == "read":
            READ_HANDLERS[f"resp:{name}"] = rc.handler
