"""Self-hosted, EAS-compatible inference gateway."""

__version__ = "0.1.0"
