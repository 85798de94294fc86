"""StringRequest / StringResponse: raw bodies, as in eas-prediction 0.36.

The request body is sent as given (a str is UTF-8 encoded by the client); the response
keeps the raw bytes in ``response_data`` (so ``str(resp)`` prints ``b'...'``, as the
original did). Additions: ``to_bytes()``, ``text`` and ``to_numpy(dtype)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Request, Response


class StringRequest(Request):
    """A request whose body is the given str or bytes."""

    def __init__(self, request_data: str | bytes | bytearray | None = None) -> None:
        self.request_data: Any = "" if request_data is None else request_data

    def __str__(self) -> str:
        data = self.request_data
        return data if isinstance(data, str) else repr(data)

    def __repr__(self) -> str:
        return f"StringRequest({self.request_data!r})"

    def to_string(self) -> str | bytes:
        """The body exactly as given (str or bytes)."""
        return self.request_data  # type: ignore[no-any-return]

    def parse_response(self, response_data: bytes) -> StringResponse:
        return StringResponse(response_data)


class StringResponse(Response):
    """The raw response body (``response_data`` is bytes)."""

    def __init__(self, response_data: Any = None) -> None:
        self.response_data: Any = "" if response_data is None else response_data

    def __str__(self) -> str:
        return str(self.response_data)

    def __repr__(self) -> str:
        return f"StringResponse({self.response_data!r})"

    def to_string(self) -> str:
        return str(self.response_data)

    def to_bytes(self) -> bytes:
        data = self.response_data
        return data.encode("utf-8") if isinstance(data, str) else bytes(data)

    @property
    def text(self) -> str:
        """The body decoded as UTF-8."""
        return self.to_bytes().decode("utf-8")

    def to_numpy(self, dtype: Any = np.uint8) -> np.ndarray:
        """The raw body as a flat ndarray of ``dtype`` (a read-only view)."""
        return np.frombuffer(self.to_bytes(), dtype=dtype)


__all__ = ["StringRequest", "StringResponse"]
