"""``eas_prediction.exception`` path: the base error class (its subclasses are in ``eas_sdk.errors``)."""

from .errors import PredictException

__all__ = ["PredictException"]
