"""``eas_prediction.predict_client`` path: the client and endpoint-type constants."""

from .errors import PredictException
from .predict import (
    ENDPOINT_TYPE_DEFAULT,
    ENDPOINT_TYPE_DIRECT,
    ENDPOINT_TYPE_GATEWAY,
    ENDPOINT_TYPE_VIPSERVER,
    PredictClient,
)

__all__ = [
    "ENDPOINT_TYPE_DEFAULT",
    "ENDPOINT_TYPE_DIRECT",
    "ENDPOINT_TYPE_GATEWAY",
    "ENDPOINT_TYPE_VIPSERVER",
    "PredictClient",
    "PredictException",
]
