"""What TLS costs per call on the gateway's HTTP port (the lean front), against plain HTTP.

Two gateways with the same service (digits.onnx in the gateway's threads, so the model's
own time hides little of the transport's; access log off), one on plain HTTP and one with
``gateway.tls`` (a certificate made here with trustme), both pinned to core 0; wrk on core
1 sends EAS predict calls (a TF PredictRequest of one digits row), in interleaved rounds:

* keep-alive: ``--connections`` connections kept open, the steady state of an SDK's pool;
  the cost is the encryption of each request and answer;
* a connection per call (``Connection: close``): each call pays a full TLS handshake.

For each it reports requests/s, p50, and the gateway's CPU per call (all its threads,
from /proc), and the TLS/plain ratios and CPU differences per call; the plain gateway's
figures are the lean front's own speed, which TLS being configurable leaves as it was.

    .venv/bin/python benchmarks/bench_tls.py [--rounds 3] [--seconds 4] [--connections 16] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._harness import (  # noqa: E402
    TOKEN,
    Child,
    Target,
    WrkResult,
    checked,
    median,
    paired,
    quick_rounds,
    report_targets,
    round_options,
    run_wrk,
    sample_model,
    serve,
    tf_predict_body,
    tree_pids,
)


def _gateway(folder: Path, model: Path, tls: dict[str, str] | None) -> tuple[Child, str]:
    folder.mkdir()
    gateway: dict[str, object] = {"access_log": False, "data_dir": str(folder / "data")}
    if tls is not None:
        gateway["tls"] = tls
    service = {"name": "digits", "processor": "onnx", "model": str(model), "token": TOKEN}
    service |= {"placement": "thread", "workers": 1}
    return serve(folder, gateway, [service], {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"})


def _row(name: str, r: WrkResult) -> str:
    cpu = f"gateway CPU {r.cpu_us_per_req:>6.1f} µs/call"
    return f"  {name:<30}{r.rps:>10.0f} req/s  p50 {r.p50_us:>7.0f} µs  {cpu}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    round_options(ap)
    args = quick_rounds(ap.parse_args())
    import trustme

    model = sample_model("digits.onnx")
    with tempfile.TemporaryDirectory(prefix="easkit-bench-tls-") as tmp:
        folder = Path(tmp)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        chain, key = folder / "server.pem", folder / "server.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
        body = tf_predict_body(folder / "body.bin", x)
        plain, plain_addr = _gateway(folder / "plain", model, None)
        secure, secure_addr = _gateway(folder / "tls", model, {"cert_file": str(chain), "key_file": str(key)})
        urls = {
            "plain": f"http://{plain_addr}/api/predict/digits",
            "tls": f"https://{secure_addr}/api/predict/digits",
        }
        pids = {"plain": plain.pid, "tls": secure.pid}
        results: dict[tuple[str, str], list[WrkResult]] = {}
        try:
            for name in urls:  # warm-up: sessions loaded, first handshakes done
                run_wrk(urls[name], body, connections=4, seconds=1, token=TOKEN)
            for rnd in range(args.rounds):
                print(f"round {rnd + 1}/{args.rounds}")
                for mode, headers, conns in (
                    ("keep-alive", {}, args.connections),
                    ("connection per call", {"Connection": "close"}, max(1, args.connections // 4)),
                ):
                    for name in ("plain", "tls"):
                        r = run_wrk(
                            urls[name],
                            body,
                            connections=conns,
                            seconds=args.seconds,
                            token=TOKEN,
                            headers=headers,
                            server_pids=tree_pids(pids[name]),
                        )
                        checked(f"{name} {mode}", r, socket_errors_ok=mode != "keep-alive")
                        results.setdefault((mode, name), []).append(r)
                        print(_row(f"{mode}, {name}", r))
        finally:
            plain.stop()
            secure.stop()

    targets: list[Target] = []
    for mode in ("keep-alive", "connection per call"):
        ratio, extra = paired(results[(mode, "plain")], results[(mode, "tls")])
        plain_cpu = median([p.cpu_us_per_req for p in results[(mode, "plain")]])
        print(f"\n{mode}: TLS/plain throughput {ratio:.2f}, TLS adds {extra:.1f} µs of gateway CPU per call "
              f"(plain: {plain_cpu:.1f} µs)")  # fmt: skip
        goal = (">=", 0.7) if mode == "keep-alive" else ("", None)
        targets.append(Target(f"{mode}: TLS / plain req/s", ratio, *goal))
        targets.append(Target(f"{mode}: TLS CPU per call", extra, "", None, " µs"))
    return 0 if report_targets("bench_tls", targets) else 1


if __name__ == "__main__":
    sys.exit(main())
