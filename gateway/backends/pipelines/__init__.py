"""Pipelines: a service made of a graph of steps (models, Python ops, pure transforms).

The ``pipeline:`` block of a service's config is parsed and checked by
``gateway.config.pipelines``; Python ops and the built-in transforms are in
``gateway.worker.ops`` (a worker process runs them too); ``runner`` runs one request
through the graph; ``backend`` is the service's dataplane backend (decode the request in
any EAS format, run, answer in the request's format); ``timings`` keeps the per-step
histograms. See docs/pipelines.md.
"""
