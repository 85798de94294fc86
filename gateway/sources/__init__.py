"""Models named by a URL, fetched into a download cache on disk (s3://, oss://, https://).

The gateway fetches a service's model once, when the service starts, and hands its workers
the local file: ``fetch_model`` (gateway.sources.fetch) over the stores
(gateway.sources.stores: boto3 for S3-compatible stores, urllib for HTTP) and the cache
(gateway.sources.cache: keyed by the object's version, checked by SHA-256, shared by every
process that uses the same folder). Below the backends, which call it, and above the config,
which only checks a URL.
"""

from gateway.sources.fetch import FetchCancelled, Fetched, FetchError, Progress, fetch_model

__all__ = ["FetchCancelled", "FetchError", "Fetched", "Progress", "fetch_model"]
