"""Where a model service runs, decided when the config is read (docs/concepts.md, "Workers").

``process``: worker processes (gateway.backends.pool): a model that crashes or hangs takes one
worker down, which is restarted; each worker has its own memory and environment, can be
scaled at runtime and autoscaled, and remote workers can join. ``thread``: the model loaded in
the gateway process (gateway.backends.threads): no hop to a worker, so a small model serves
several times the calls, but a crash takes the gateway down and a stuck run is interrupted,
never killed. ``auto``, the default: an onnx, xgboost or lightgbm service runs in the
gateway's threads (ONNX Runtime, XGBoost and LightGBM release the GIL while they compute, and
take their thread counts per session or per call, not for the whole process) unless it asks
for something only worker processes give; every other processor runs in worker processes,
whose isolation user code needs, and the runtimes that hold the GIL in their Python parts
(scikit-learn, PMML) or set thread pools for the whole process (PyTorch, TensorFlow).

The placement chosen is the only one the rest of the gateway sees (``ServiceConfig.placement``);
``ServiceConfig.placement_reason`` says why ``auto`` chose it, and is empty where the config
named the placement itself.
"""

from __future__ import annotations

from typing import Any

PLACEMENTS = ("auto", "process", "thread")
# What a service without ``placement`` gets: what KServe, MLServer and Triton do by default.
DEFAULT_PLACEMENT = "auto"
# The runtimes ``auto`` runs in the gateway's threads, by the library that releases the GIL
# while it computes.
_RELEASES_GIL = {"onnx": "ONNX Runtime", "xgboost": "XGBoost", "lightgbm": "LightGBM"}
THREAD_PROCESSORS = tuple(_RELEASES_GIL)


def thread_reason(processor: str) -> str:
    """Why ``auto`` runs a ``processor`` service (one of THREAD_PROCESSORS) in threads."""
    library = _RELEASES_GIL[processor]
    return f"auto: {processor} models run in the gateway's threads ({library} releases the GIL)"


def process_needs(raw: Any, *, remote: bool, autoscale: bool, env: bool) -> list[str]:
    """What a service description asks for that only worker processes give, each as its key
    says it (empty: nothing)."""
    needs = []
    if remote:
        needs.append("remote_workers")
    if autoscale:
        needs.append("autoscale")
    if env:  # set in a worker process's environment (gateway.worker.main)
        needs.append("env")
    stall = raw.get("stall_timeout_s") if isinstance(raw, dict) else None
    if stall is not None and stall != 0:  # a stuck worker process is restarted; a thread is not
        needs.append("stall_timeout_s")
    return needs


def resolve_placement(placement: str, processor: str, needs: list[str]) -> tuple[str, str]:
    """``(placement, reason)``: ``auto`` resolved for the service, with why; any other value
    as the config says it, with no reason."""
    if placement != "auto":
        return placement, ""
    if processor not in THREAD_PROCESSORS:
        return "process", f"auto: a {processor or 'non-model'} service runs in worker processes"
    if needs:
        return "process", f"auto: {', '.join(needs)} needs worker processes"
    return "thread", thread_reason(processor)


def placement_to_write(placement: str, reason: str, processor: str) -> str | None:
    """The ``placement`` a service description written back must name to be read as the same
    service: None where leaving it out gives it again (``auto``'s choice is chosen again)."""
    if reason:
        return None
    if placement != "process" or processor in THREAD_PROCESSORS:  # auto may choose otherwise
        return placement
    return None


__all__ = [
    "DEFAULT_PLACEMENT",
    "PLACEMENTS",
    "THREAD_PROCESSORS",
    "placement_to_write",
    "process_needs",
    "resolve_placement",
    "thread_reason",
]
