"""``eas-gateway services ...`` and ``eas-gateway status``: the admin API from a shell.

``create``, ``update`` and ``scale`` print their progress to stderr while the gateway carries
them out (gateway.cli.progress; ``--quiet``: the result only).

``create`` and ``update`` wait for the service to be ready and exit 1 with the reason when it
is not (``--no-wait``: exit 0 once the gateway has carried the change out, ready or not).

The admin API is found at ``--admin URL`` or ``EAS_ADMIN_URL`` (default
http://127.0.0.1:8081), its token in ``--token`` or ``EAS_ADMIN_TOKEN``. Service files are
YAML or JSON: one ``services:`` entry, a list of them, or a config file's ``services:``;
relative ``model`` and ``entry`` paths are resolved against the file's directory.
Failures print the gateway's code and message and exit 1.

``status`` reads the gateway's main port (``--url``, default http://127.0.0.1:8080: its status
snapshot, served to this machine without a token), or the admin API when ``--admin`` or
``EAS_ADMIN_URL`` is given; both print the same table (gateway.cli.status_text).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_ADMIN = "http://127.0.0.1:8081"
DEFAULT_GATEWAY = "http://127.0.0.1:8080"


class AdminError(Exception):
    pass


def admin_options() -> argparse.ArgumentParser:
    """``--admin`` and ``--token``, for a command's parser and its operations' parsers:
    accepted before and after the operation (SUPPRESS: an option given at one level is not
    overwritten by the other level's default)."""
    common = argparse.ArgumentParser(add_help=False)
    admin_help = f"admin API URL (default: $EAS_ADMIN_URL or {DEFAULT_ADMIN})"
    common.add_argument("--admin", default=argparse.SUPPRESS, help=admin_help)
    common.add_argument("--token", default=argparse.SUPPRESS, help="admin token (default: $EAS_ADMIN_TOKEN)")
    return common


def add_parsers(sub: Any) -> None:
    common = admin_options()
    s = sub.add_parser("services", help="manage a running gateway's services", parents=[common])
    ops = s.add_subparsers(dest="op", required=True)
    ops.add_parser("list", help="services and their state", parents=[common])
    get = ops.add_parser("get", help="one service: its description and live state (JSON)", parents=[common])
    get.add_argument("name")
    quiet = "print the result only, not the progress lines (stderr) while the change runs"
    for op, what in (("create", "create services"), ("update", "update services (rolling)")):
        p = ops.add_parser(op, help=f"{what} from a YAML or JSON file", parents=[common])
        p.add_argument("-f", "--file", required=True, help="service description file ('-': stdin)")
        p.add_argument("-q", "--quiet", action="store_true", help=quiet)
        p.add_argument(
            "--no-wait", action="store_true",
            help="exit 0 once the gateway has carried the change out, whether the service is ready or not",
        )  # fmt: skip
    scale = ops.add_parser("scale", help="set a service's worker count", parents=[common])
    scale.add_argument("name")
    scale.add_argument("workers", type=int)
    scale.add_argument("-q", "--quiet", action="store_true", help=quiet)
    traffic = ops.add_parser(
        "traffic",
        help="split the calls between a service's versions (percents adding up to 100)",
        parents=[common],
    )
    traffic.add_argument("name")
    traffic.add_argument("weights", nargs="+", metavar="VERSION=PERCENT", help="e.g. 1=90 2=10")
    canary = ops.add_parser(
        "canary",
        help="move a service's calls to a new version step by step, rolled back by itself when it does worse "
        "than the old one (--steps 100: blue-green)",
        parents=[common],
    )
    canary.add_argument("name")
    canary.add_argument("--version", help="the version to release")
    canary.add_argument(
        "--steps", default="100", help="percents, rising (default 100: all at once, blue-green)"
    )
    canary.add_argument(
        "--interval", default="60s", help="how long each step lasts: 60s, 500ms, 2m (default 60s)"
    )
    canary.add_argument(
        "--max-error-increase", type=float, default=0.02,
        help="how far the new version's error rate may exceed the old one's (default 0.02: 2 points)",
    )  # fmt: skip
    canary.add_argument(
        "--max-p99-ratio",
        type=float,
        default=2.0,
        help="how many times the old version's p99 the new one's may be",
    )
    canary.add_argument(
        "--min-calls", type=int, default=20, help="calls the new version answers before a step is judged"
    )
    canary.add_argument("--abort", action="store_true", help="stop the canary under way, its split put back")
    canary.add_argument("--no-wait", action="store_true", help="return once the canary has started")
    canary.add_argument("-q", "--quiet", action="store_true", help=quiet)
    delete = ops.add_parser("delete", help="drain and remove a service", parents=[common])
    delete.add_argument("name")
    st = sub.add_parser(
        "status",
        help="a table of services, workers, rates and latency, read from the gateway's main port "
        f"(--url, default {DEFAULT_GATEWAY}) or from its admin API (--admin, $EAS_ADMIN_URL)",
        parents=[common],
    )
    st.add_argument(
        "--url",
        help=f"the gateway's own URL (default {DEFAULT_GATEWAY}); from another machine with --token, "
        "the admin token",
    )


class Admin:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if not self.url.startswith(("http://", "https://")):
            raise AdminError(f"the admin URL must start with http:// or https://, got {self.url!r}")
        # The scheme is checked just above.
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read()
            try:
                doc = json.loads(raw)
                message = f"{doc.get('code', exc.code)}: {doc.get('message', raw.decode(errors='replace'))}"
            except (ValueError, AttributeError):
                message = f"{exc.code}: {raw.decode(errors='replace')[:500]}"
            raise AdminError(message) from None
        except urllib.error.URLError as exc:
            raise AdminError(
                f"cannot reach the admin API at {self.url}: {exc.reason} (the gateway serves it when its "
                "config file has an admin: section, see docs/operations.md; --admin URL names another)"
            ) from None


def read_services(path: str) -> list[dict[str, Any]]:
    """Service descriptions from a YAML or JSON file, relative paths made absolute."""
    import yaml

    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    if isinstance(doc, dict) and "services" in doc and "name" not in doc:
        doc = doc["services"]
    items = doc if isinstance(doc, list) else [doc]
    if not items or not all(isinstance(i, dict) for i in items):
        raise AdminError(f"{path}: expected a service description (a mapping) or a list of them")
    base = Path.cwd() if path == "-" else Path(path).resolve().parent
    for item in items:
        for key in ("model", "entry"):
            value = item.get(key)
            if isinstance(value, str):
                item[key] = _resolve(value, base, key == "entry")
    return items


def _resolve(value: str, base: Path, entry: bool) -> str:
    target, sep, cls = value.rpartition(":") if entry else (value, "", "")
    if entry and not target.endswith(".py"):
        return value  # package.module:Class
    p = Path(target)
    if not p.is_absolute() and (base / p).exists():
        target = str((base / p).resolve())
    return f"{target}{sep}{cls}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _workers(svc: dict[str, Any]) -> str:
    ws = svc.get("workers")
    if ws is None:
        return "-"
    return f"{sum(1 for w in ws if w.get('state') == 'ready')}/{len(ws)}"


def list_table(services: list[dict[str, Any]]) -> str:
    rows = [["NAME", "PROCESSOR", "PLACEMENT", "READY", "WORKERS", "RESTARTS", "IN-FLIGHT", "REASON"]]
    for s in services:
        rows.append([
            s["name"], s["spec"]["processor"], s.get("placement", "-"), "yes" if s["ready"] else "no",
            _workers(s), str(s.get("restarts", "-")), str(s.get("in_flight", "-")), s.get("reason", ""),
        ])  # fmt: skip
    return _table(rows)


def status(args: argparse.Namespace, token: str | None) -> int:
    """``eas-gateway status``: the gateway's status snapshot, once, as text: from its admin API
    when one is named (``--admin``, ``$EAS_ADMIN_URL``), else from its main port."""
    from gateway.cli.status_text import fetch, render

    admin = None if args.url else getattr(args, "admin", None) or os.environ.get("EAS_ADMIN_URL")
    if admin:
        try:
            doc = Admin(admin, token).call("GET", "/admin/status")
        except AdminError as exc:
            print(f"eas-gateway: {exc}", file=sys.stderr)
            return 1
        print(render(doc))
        return 0
    url = args.url or DEFAULT_GATEWAY
    try:
        print(render(fetch(url, token)))
    except urllib.error.HTTPError as exc:
        with exc:
            # 401 and 403: from another machine the status needs the admin token.
            needs = "; from another machine it needs the admin token (--token, $EAS_ADMIN_TOKEN)"
            hint = needs if exc.code in (401, 403) else ""
        print(f"eas-gateway: cannot read the status of the gateway at {url}: {exc}{hint}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        # Only the default address was tried: say how to name another.
        other = "; give the gateway's address (--url http://HOST:PORT) or its admin API (--admin URL)"
        hint = "" if args.url else other
        print(f"eas-gateway: cannot read the status of the gateway at {url}: {reason}{hint}", file=sys.stderr)
        return 1
    return 0


def _change(
    args: argparse.Namespace, admin: Admin, name: str, what: str, method: str, path: str, body: Any
) -> Any:
    """One change through the admin API, with its progress unless ``--quiet``."""
    if args.quiet:
        return admin.call(method, path, body)
    from gateway.cli.progress import with_progress

    return with_progress(
        str(name), what, lambda: admin.call(method, path, body),
        lambda: admin.call("GET", f"/admin/services/{name}"), sys.stderr,
    )  # fmt: skip


def _weights(items: list[str]) -> dict[str, int]:
    """``1=90 2=10`` -> {"1": 90, "2": 10}; the gateway checks the versions and the sum."""
    out: dict[str, int] = {}
    for item in items:
        version, sep, percent = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[version.strip()] = int(percent)
        except ValueError:
            raise AdminError(f"traffic: expected VERSION=PERCENT (e.g. 1=90), got {item!r}") from None
    return out


def _canary(args: argparse.Namespace, admin: Admin) -> int:
    """Start (or abort) a canary, then follow it to its end: a line on stderr per step and
    per judged window, the outcome on stdout; 0 when the new version was promoted."""
    path = f"/admin/services/{args.name}/canary"
    if args.abort:
        doc = admin.call("DELETE", path)
        print(f"service {args.name}: canary aborted; {_split_text(doc)}")
        return 0
    if args.version is None:
        raise AdminError("canary: --version is required (the version to release)")
    try:
        steps = [int(p) for p in args.steps.split(",")]
    except ValueError:
        raise AdminError(
            f"canary: --steps expects percents separated by commas, e.g. 5,25,50,100; got {args.steps!r}"
        ) from None
    body = {
        "version": args.version, "steps": steps, "interval_s": args.interval,
        "max_error_increase": args.max_error_increase, "max_p99_ratio": args.max_p99_ratio,
        "min_calls": args.min_calls,
    }  # fmt: skip
    canary = admin.call("POST", path, body)["canary"]
    if args.no_wait:
        print(f"service {args.name}: canary of version {canary['version']} started")
        return 0
    import time

    shown: tuple[Any, ...] = ()
    printed = 0  # windows already shown
    while True:
        doc = admin.call("GET", f"/admin/services/{args.name}")
        canary = doc["canary"]
        state = (canary["phase"], canary["percent"])
        if not args.quiet:
            for window in canary["windows"][printed:]:
                print(f"service {args.name}: {_window_text(canary, window)}", file=sys.stderr)
            printed = len(canary["windows"])
            if state != shown and canary["phase"] in ("running", "waiting for calls"):
                step = canary["steps"].index(canary["percent"]) + 1
                print(
                    f"service {args.name}: version {canary['version']} takes {canary['percent']}% "
                    f"(step {step}/{len(canary['steps'])}, {canary['phase']}, {canary['elapsed_s']:g} s)",
                    file=sys.stderr,
                )
            shown = state
        if canary["phase"] not in ("starting", "running", "waiting for calls"):
            break
        time.sleep(0.5)
    outcome = f"service {args.name}: version {canary['version']} {canary['phase']}"
    if canary["reason"]:
        outcome += f" at {canary['percent']}%: {canary['reason']}"
    print(f"{outcome}; {_split_text(doc)}")
    return 0 if canary["phase"] == "promoted" else 1


def _window_text(canary: dict[str, Any], window: dict[str, Any]) -> str:
    new, old = window["new"], window["old"]

    def p99(w: dict[str, Any]) -> str:
        return "-" if w["p99_ms"] is None else f"{w['p99_ms']:g} ms"

    return (
        f"at {window['percent']}%: version {canary['version']} failed {new['error_rate']:.1%} "
        f"of {new['calls']} calls, p99 {p99(new)}; version {canary['from']} {old['error_rate']:.1%} "
        f"of {old['calls']}, p99 {p99(old)}"
    )


def _split_text(doc: dict[str, Any]) -> str:
    split = doc["spec"].get("traffic") or {}
    return "traffic: " + (
        ", ".join(f"version {v}: {w}%" for v, w in split.items()) or "all to the latest version"
    )


def _execute(args: argparse.Namespace, admin: Admin) -> int:
    op = args.op
    failed = 0
    if op == "list":
        print(list_table(admin.call("GET", "/admin/services")["services"]))
    elif op == "get":
        print(json.dumps(admin.call("GET", f"/admin/services/{args.name}"), indent=2))
    elif op in ("create", "update"):
        for item in read_services(args.file):
            name = item.get("name")
            if op == "create":
                doc = _change(args, admin, name, "starting", "POST", "/admin/services", item)
            else:
                doc = _change(args, admin, name, "updating", "PUT", f"/admin/services/{name}", item)
            state = "ready" if doc["ready"] else f"not ready: {doc.get('reason', '')}"
            print(f"service {doc['name']} {op}d ({_workers(doc)} workers ready; {state})")
            if not doc["ready"] and not args.no_wait:
                # The gateway answers once the workers are ready, or have failed to start, or
                # its worker_start_timeout_s is over: not ready now means it did not come.
                reason = doc.get("reason") or "it has no ready worker"
                print(f"eas-gateway: service {doc['name']} is not ready: {reason}", file=sys.stderr)
                failed = 1
    elif op == "scale":
        path, body = f"/admin/services/{args.name}/scale", {"workers": args.workers}
        doc = _change(args, admin, args.name, "scaling", "POST", path, body)
        print(f"service {doc['name']} scaled to {args.workers} worker(s) ({_workers(doc)} ready)")
    elif op == "traffic":
        doc = admin.call("PUT", f"/admin/services/{args.name}/traffic", {"traffic": _weights(args.weights)})
        split = doc["spec"].get("traffic") or {}
        shown = ", ".join(f"version {v}: {w}%" for v, w in split.items()) or "all to the latest version"
        print(f"service {doc['name']} traffic: {shown}")
    elif op == "canary":
        failed = _canary(args, admin)
    elif op == "delete":
        admin.call("DELETE", f"/admin/services/{args.name}")
        print(f"service {args.name} deleted")
    return failed


def run(args: argparse.Namespace) -> int:
    token = getattr(args, "token", None) or os.environ.get("EAS_ADMIN_TOKEN") or None
    if args.command == "status":
        return status(args, token)
    url = getattr(args, "admin", None) or os.environ.get("EAS_ADMIN_URL") or DEFAULT_ADMIN
    try:
        return _execute(args, Admin(url, token))
    except (AdminError, OSError) as exc:
        print(f"eas-gateway: {exc}", file=sys.stderr)
        return 1


__all__ = ["Admin", "AdminError", "add_parsers", "list_table", "read_services", "run", "status"]
