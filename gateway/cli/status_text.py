"""``eas-gateway status``: the gateway's status snapshot as text, one table whether it came from
the main port (``GET /api/status``, the status page's) or the admin API (``GET /admin/status``,
the same snapshot)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(status: dict[str, Any]) -> str:
    """One block per service: its figures, then its workers and queues."""
    lines = [
        f"gateway {status['gateway']['version']}, up {status['uptime_s']:.0f} s"
        f"{' (shutting down)' if status.get('shutting_down') else ''};"
        f" rates over the last {status['window_s']:.0f} s",
        "",
        f"{'service':<20}{'kind':<8}{'ready':<7}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'5xx %':>7}"
        f"{'requests':>10}{'restarts':>10}",
    ]
    for s in status["services"]:
        kind = s["processor"] + ("*" if s.get("async") else "")
        lines.append(
            f"{s['name']:<20}{kind:<8}{'yes' if s['ready'] else 'NO':<7}{_num(s['rate_rps'], 1):>8}"
            f"{_num(s['p50_ms'], 2):>9}{_num(s['p99_ms'], 2):>9}{_num(100 * s['error_rate'], 1):>7}"
            f"{s['requests_total']:>10}{s.get('restarts', '-'):>10}"
        )
        if s.get("placement"):  # a model service: in worker processes or the gateway's threads
            why = f" ({s['placement_reason']})" if s.get("placement_reason") else ""
            lines.append(f"    placement: {s['placement']}{why}")
        if not s["ready"] and s.get("reason"):
            lines.append(f"    not ready: {s['reason']}")
        error = s.get("last_error")
        if isinstance(error, dict):  # the last call that failed: when (wall clock), status, message
            when = time.strftime("%H:%M:%S", time.localtime(error["at"]))
            lines.append(f"    last error: {error['status']} at {when}: {error['message']}")
        for w in s.get("workers", []):
            lines.append(
                f"    worker {w.get('id')}: pid {w.get('pid', '-')}, {w.get('state')},"
                f" {w.get('outstanding', 0)} in flight, {w.get('restarts', 0)} restarts"
            )
        for name, q in s.get("queues", {}).items():
            lines.append(
                f"    queue {name}: depth {q['length']}, pending {q['pending']}, lag {q['lag']},"
                f" {q['consumers']} consumers"
            )
    if any(s.get("async") for s in status["services"]):
        lines.append("(* asynchronous: fronted by a queue)")
    return "\n".join(lines)


def fetch(url: str, token: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """The snapshot of the gateway at ``url`` (``http://host:port``); ``token``, the admin
    token, is needed unless the gateway is on this machine (gateway.fronts.status_access)."""
    base = url if "://" in url else f"http://{url}"
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {url!r}")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(base.rstrip("/") + "/api/status", headers=headers)  # noqa: S310
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
        data: dict[str, Any] = json.load(resp)
    return data
