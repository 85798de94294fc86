"""The queue service: store semantics, SQLite backend, HTTP + WebSocket adapters."""

from __future__ import annotations

from gateway.queue.manager import QueueManager

__all__ = ["QueueManager"]
