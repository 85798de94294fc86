"""Wire constants of the PAI-EAS protocols: the one source for SDK and gateway."""

from __future__ import annotations

# --- predict -------------------------------------------------------------------
PREDICT_PATH_PREFIX = "/api/predict/"
DISCOVERY_PATH_PREFIX = "/api/v1/servicediscovery/upstreams/"
LEGACY_DISCOVERY_PATH_PREFIX = "/exported/apis/eas.alibaba-inc.k8s.io/v1/upstreams/"

ENDPOINT_TYPE_GATEWAY = "DEFAULT"
ENDPOINT_TYPE_DEFAULT = "DEFAULT"
ENDPOINT_TYPE_DIRECT = "DIRECT"
ENDPOINT_TYPE_VIPSERVER = "VIPSERVER"

DEFAULT_CONTENT_TYPE = "application/octet-stream"
HMAC_SCHEME = "EAS"

HEADER_AUTHORIZATION = "Authorization"
HEADER_CONTENT_MD5 = "Content-MD5"
HEADER_CONTENT_TYPE = "Content-Type"
HEADER_DATE = "Date"
HEADER_REQUEST_ID = "X-Request-Id"
HEADER_EAS_REQUEST_ID = "X-Eas-Request-Id"
# Remaining time budget of the caller, in milliseconds (our SDK sends it).
HEADER_DEADLINE_MS = "X-Eas-Deadline-Ms"
HEADER_RETRY_AFTER = "Retry-After"
# Optional explicit request format for the onnx processor: tf | torch | blade | json.
HEADER_REQUEST_FORMAT = "X-Eas-Request-Format"

# --- queue ---------------------------------------------------------------------
HEADER_QUEUE_UID = "X-EAS-QueueService-Redis-Uid"
HEADER_QUEUE_GID = "X-EAS-QueueService-Redis-Gid"
HEADER_QUEUE_REQUEST_ID = "X-Eas-Queueservice-Request-Id"
HEADER_QUEUE_PRIORITY = "X-EAS-QueueService-Priority"
CONTENT_TYPE_PROTOBUF = "application/vnd.google.protobuf"
DEFAULT_QUEUE_GROUP = "eas"
SINK_SUFFIX = "sink"
TAG_REQUEST_ID = "requestId"
TAG_STATUS = "status"

Q_INDEX = "_index_"
Q_INDEXES = "_indexes_"
Q_LENGTH = "_length_"
Q_TIMEOUT = "_timeout_"
Q_RAW = "_raw_"
Q_AUTO_DELETE = "_auto_delete_"
Q_ATTRS = "_attrs_"
Q_SEARCH = "_search_"
Q_TRUNC = "_trunc_"
Q_WATCH = "_watch_"
Q_WINDOW = "_window_"
Q_INDEX_ONLY = "_index_only_"
Q_AUTO_COMMIT = "_auto_commit_"
Q_REQUEST_ID = "requestId"
Q_PRIORITY = "_priority_"
Q_COUNT = "_count_"
