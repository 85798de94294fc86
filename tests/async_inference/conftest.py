from __future__ import annotations

from tests.e2e.gateway_proc import gateway_factory

__all__ = ["gateway_factory"]
