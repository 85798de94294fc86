"""Processors: what a worker runs for each request (onnx, python).

``base`` holds the interface, ``registry.create_processor`` picks the implementation
for a service; this package module imports neither, so importing one never drags in
the others.
"""
