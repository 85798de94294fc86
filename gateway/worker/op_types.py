"""What an op's hooks hand back to the step that runs them (gateway/worker/ops.py)."""

from __future__ import annotations


class OpError(Exception):
    """Raised by an op (or a transform) to answer the request with ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class SkipModel(dict):  # type: ignore[type-arg]
    """``preprocess``'s answer when the step's model is to be skipped (a Paddle op's
    ``is_skip``): handed to ``postprocess`` as the model's outputs would have been."""


__all__ = ["OpError", "SkipModel"]
