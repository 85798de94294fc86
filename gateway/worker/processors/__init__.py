"""Processors: what a worker runs for each request: a model runtime (onnx, sklearn, xgboost,
lightgbm; ``model`` holds what they share) or user code (python, op).

``base`` holds the interface, ``registry.create_processor`` picks the implementation
for a service; this package module imports neither, so importing one never drags in
the others.
"""
