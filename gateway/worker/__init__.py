"""The worker process: what runs there and only that. Its entry point, the RPC server and
direct port it serves, the compute queue, the processors (ONNX Runtime, user Python code,
pipeline ops) and the agent that runs a worker on another host. The gateway may also run a
processor in its own threads (gateway.backends.threads)."""
