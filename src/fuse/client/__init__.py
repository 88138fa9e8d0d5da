"""The Python SDK: `Client` (sync) and `AsyncClient` over one no-I/O core."""
from ._core import ApiError, is_conflict, is_invalid_argument, is_not_found
from ._sync import Client
from ._async import AsyncClient

__all__ = ["ApiError", "AsyncClient", "Client", "is_conflict", "is_invalid_argument", "is_not_found"]
