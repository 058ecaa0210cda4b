"""tenantkv: a multi-tenant key-value database server with throttling built in.

The client API lives here: :class:`Client` (blocking) and :class:`AsyncClient`
(Trio), their overload retry policy (:class:`RetryPolicy`) and command
monitoring (:class:`CommandListener` and the events); errors are in
:mod:`tenantkv.errors`. See docs/client.md.
"""

from tenantkv._version import __version__
from tenantkv.client.async_client import AsyncClient
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
