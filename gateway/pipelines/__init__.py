"""Pipelines: a service made of a graph of steps (models, Python ops, pure transforms).

``graph`` parses and validates the ``pipeline:`` block of a service's config (no I/O, no
gateway imports, so ``gateway.config`` can use it); ``ops`` loads Python ops and holds the
built-in transforms; ``runner`` runs one request through the graph; ``backend`` is the
service's dataplane ``Backend`` (decode the request in any EAS format, run, answer in the
request's format); ``timings`` keeps the per-step histograms. See docs/pipelines.md.
"""
