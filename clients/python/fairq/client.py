"""The fairq clients, under the module name the project layout gives them.

:class:`AsyncClient` (``grpc.aio``) lives in ``fairq._async_client`` and its
blocking twin :class:`Client` in ``fairq._sync_client``; both are also
exported from ``fairq`` itself, which is the usual way to import them.
"""

from fairq._async_client import AsyncClient
from fairq._sync_client import Client

__all__ = ["AsyncClient", "Client"]
