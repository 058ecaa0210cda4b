"""tenantkv: a multi-tenant key-value database server with throttling built in.

The client API lives here: :class:`Client` (blocking) and :class:`AsyncClient`
(Trio), their overload retry policy (:class:`RetryPolicy`) and command
monitoring (:class:`CommandListener` and the events); errors are in
:mod:`tenantkv.errors`. See docs/client.md.
"""

from typing import TYPE_CHECKING, Any

from tenantkv._version import __version__
from tenantkv.client.core import Item, Record
from tenantkv.client.monitoring import (
    CommandEventLog,
    CommandFailedEvent,
    CommandListener,
    CommandStartedEvent,
    CommandSucceededEvent,
)
from tenantkv.client.retry import RetryPolicy, RetryTokenBucket
from tenantkv.client.sync_client import Client, Pipeline

if TYPE_CHECKING:
    from tenantkv.client.async_client import AsyncClient


def __getattr__(name: str) -> Any:
    # AsyncClient imports Trio, which takes most of a second of CPU to import:
    # a script or the admin CLI that uses the blocking Client does not pay it.
    if name == "AsyncClient":
        from tenantkv.client.async_client import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'tenantkv' has no attribute {name!r}")


__all__ = [
    "AsyncClient",
    "Client",
    "CommandEventLog",
    "CommandFailedEvent",
    "CommandListener",
    "CommandStartedEvent",
    "CommandSucceededEvent",
    "Item",
    "Pipeline",
    "Record",
    "RetryPolicy",
    "RetryTokenBucket",
    "__version__",
]
