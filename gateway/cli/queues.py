"""``eas-gateway queues groups|delete-group``: a running gateway's consumer groups, through
its admin API (found as ``eas-gateway services`` finds it: ``--admin``/``EAS_ADMIN_URL``,
``--token``/``EAS_ADMIN_TOKEN``). Failures print the gateway's code and message and exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from typing import Any

from gateway.cli.services import DEFAULT_ADMIN, Admin, AdminError, _table, admin_options


def add_parsers(sub: Any) -> None:
    common = admin_options()
    q = sub.add_parser("queues", help="a queue service's consumer groups", parents=[common])
    ops = q.add_subparsers(dest="op", required=True)
    groups = ops.add_parser("groups", help="list the consumer groups of a service's queues", parents=[common])
    groups.add_argument("service")
    delete = ops.add_parser(
        "delete-group",
        help="delete a consumer group and the records only it still needed",
        parents=[common],
    )
    delete.add_argument("service")
    delete.add_argument("group")
    delete.add_argument("--queue", help="the service's queue (default: its own; 'sink': an async service's)")


def groups_table(doc: dict[str, Any]) -> str:
    rows = [["QUEUE", "GROUP", "CURSOR", "PENDING", "LAG", "CONSUMERS", "IDLE S", "LAST SEEN"]]
    for qname, groups in doc["queues"].items():
        for g in groups:
            rows.append([
                qname, g["group"], str(g["cursor"]), str(g["pending"]), str(g["lag"]),
                str(g["consumers"]), f"{g['idle_s']:.0f}", g["last_seen"],
            ])  # fmt: skip
    return _table(rows)


def run(args: argparse.Namespace) -> int:
    url = getattr(args, "admin", None) or os.environ.get("EAS_ADMIN_URL") or DEFAULT_ADMIN
    token = getattr(args, "token", None) or os.environ.get("EAS_ADMIN_TOKEN") or None
    admin = Admin(url, token)
    service = urllib.parse.quote(args.service, safe="")
    try:
        if args.op == "groups":
            print(groups_table(admin.call("GET", f"/admin/services/{service}/groups")))
        else:
            path = f"/admin/services/{service}/groups/{urllib.parse.quote(args.group, safe='')}"
            if args.queue:
                path += "?" + urllib.parse.urlencode({"queue": args.queue})
            doc = admin.call("DELETE", path)
            n = doc["records_deleted"]
            print(f"group {doc['deleted']} of queue {doc['queue']} deleted ({n} record(s) deleted with it)")
    except (AdminError, OSError) as exc:
        print(f"eas-gateway: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_parsers", "groups_table", "run"]
