"""``eas_prediction.queue_client`` path: the queue client, its watcher, records and header names."""

from ._core.constants import HEADER_AUTHORIZATION as HeaderAuthorization
from ._core.constants import HEADER_QUEUE_GID as HeaderRedisGid
from ._core.constants import HEADER_QUEUE_REQUEST_ID as HeaderRequestId
from ._core.constants import HEADER_QUEUE_UID as HeaderRedisUid
from .queue import DataFrame, QueueClient, Watcher

__all__ = [
    "DataFrame",
    "HeaderAuthorization",
    "HeaderRedisGid",
    "HeaderRedisUid",
    "HeaderRequestId",
    "QueueClient",
    "Watcher",
]
