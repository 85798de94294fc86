"""The V2 (Open Inference Protocol) gRPC endpoint: a ``grpc.aio`` server in the gateway process,
on its event loop, and a thin adapter over the one dataplane (see ``servicer``).

Started when ``gateway.grpc_port`` (or ``--grpc-port``) is set; needs the ``grpc`` extra.
"""
