"""``eas_prediction.request`` path: the abstract ``Request``/``Response`` bases."""

from .requests.base import Request, Response

__all__ = ["Request", "Response"]
