"""``eas_prediction.blade_tf_request`` path: ``TFRequest``/``TFResponse`` for Blade processors.

Alibaba's eas-prediction documentation calls a Blade model through TensorFlow-style methods with
``from eas_prediction.blade_tf_request import TFRequest``: ``add_feed(name, shape,
dtype, content)`` with the batch size taken from ``shape[0]``, sent as a ``blade.Request``.
These are :class:`~eas_sdk.requests.BladeTFRequest` and ``BladeTFResponse``.
"""

from .requests.blade import BladeTFRequest as TFRequest
from .requests.blade import BladeTFResponse as TFResponse

__all__ = ["TFRequest", "TFResponse"]
