"""tenantkv: a multi-tenant key-value database server with throttling built in.

The client API lives here: :class:`Client` (blocking) and :class:`AsyncClient`
(Trio); errors are in :mod:`tenantkv.errors`.
"""

from tenantkv._version import __version__
from tenantkv.client.async_client import AsyncClient
from tenantkv.client.core import Item, Record
from tenantkv.client.sync_client import Client, Pipeline

__all__ = ["AsyncClient", "Client", "Item", "Pipeline", "Record", "__version__"]
