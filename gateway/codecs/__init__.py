"""Wire formats the gateway speaks beside EAS (whose codec, eas_sdk.codecs.eas, the SDK shares):
KServe V1 and V2 (JSON, binary, gRPC messages), Paddle Serving, Cluster Serving, the framed
worker RPC, pipeline values in shared memory, parsing large bodies off the event loop, and
finished spans as OTLP/HTTP's protobuf (imported only when tracing is on)."""
