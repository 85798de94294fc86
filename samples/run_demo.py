"""The main job: serve the samples with the gateway and call them with every sample client.

    python samples/run_demo.py            # build models, start the gateway, run every client, stop
    python samples/run_demo.py --serve    # build models and leave the gateway running (Ctrl-C stops)

The gateway is started exactly as a user would start it:
``python -m gateway serve --config samples/services.yaml``, in a process group of its own
with its workers. SIGINT (Ctrl-C) or SIGTERM to this script stops that whole group and
removes the script's temporary folder; the gateway removes its own (the workers' sockets).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent
ROOT = SAMPLES.parent
CLIENTS = [
    "string_client.py",
    "tf_client.py",
    "torch_client.py",
    "blade_client.py",
    "json_client.py",
    "kserve_client.py",
    "direct_client.py",
    "async_client.py",
    "queue_client.py",
    "cluster_serving_client.py",
]


def build_models() -> None:
    # Every model services.yaml names (digits.onnx, cluster_serving.onnx, ...).
    subprocess.run([sys.executable, str(SAMPLES / "build_models.py")], check=True, cwd=ROOT)


def child_env(work: Path) -> dict[str, str]:
    """The environment of the gateway, its workers and the clients: their temporary files go
    into the demo's own folder, which goes when the demo ends, however the gateway ended."""
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def start_gateway(
    port: int | None, port_file: Path, data_dir: Path | None, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(SAMPLES / "services.yaml")]
    if port is not None:
        cmd += ["--port", str(port)]
    cmd += ["--port-file", str(port_file)]
    if data_dir is not None:  # the demo starts from empty queues; --serve keeps var/gateway
        env = {**env, "EASGW_DATA_DIR": str(data_dir)}
    return subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env=env)


def wait_ready(proc: subprocess.Popen[bytes], port_file: Path, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited early with code {proc.returncode}")
        if port_file.exists() and port_file.read_text().strip():
            return port_file.read_text().strip()
        time.sleep(0.1)
    raise SystemExit("gateway did not become ready in time")


class Stopped(Exception):
    """SIGTERM (or SIGHUP) arrived: unwind like Ctrl-C, so the gateway is stopped on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group is gone already


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the gateway's process group (the gateway and its workers), SIGKILL to
    whatever is left of it after 30 s. A signal that comes meanwhile is passed on (the
    gateway takes a second one as "stop draining now") instead of cutting the stop short."""

    def forward(signum: int, _frame: object) -> None:
        _killpg(proc.pid, signal.Signals(signum))

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = proc.returncode
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait(5)
    # The gateway is gone; a worker it lost track of would still be in its group.
    _killpg(proc.pid, signal.SIGKILL)
    return rc if rc is not None else proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help="leave the gateway running for people to try")
    ap.add_argument(
        "--port", type=int, default=None, help="listen port (default: services.yaml; demo: free port)"
    )
    args = ap.parse_args()
    # Ctrl-C stops the demo however it was started: a shell that starts a command in the
    # background (`&`, nohup) hands it SIGINT ignored, and Python then raises no
    # KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGHUP, _raise_stopped)
    try:
        build_models()
        work = Path(tempfile.mkdtemp(prefix="easkit-demo-"))
        try:
            return run(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except (KeyboardInterrupt, Stopped) as exc:
        if args.serve:
            return 0  # the documented way to stop the gateway it serves
        return 128 + (exc.signum if isinstance(exc, Stopped) else signal.SIGINT)


def run(args: argparse.Namespace, work: Path) -> int:
    port_file = work / "address"
    env = child_env(work)
    proc = start_gateway(
        args.port if args.serve else (args.port or 0), port_file, None if args.serve else work / "data", env
    )
    try:
        address = wait_ready(proc, port_file)
        endpoint = f"http://{address}"
        print(f"\n== gateway ready at {endpoint}", flush=True)
        if args.serve:
            print("   services: digits (token 'secret-token'), echo; Ctrl-C stops the gateway", flush=True)
            print(f"   try: {sys.executable} samples/clients/tf_client.py --endpoint {endpoint}", flush=True)
            proc.wait()
            return 0
        failures = []
        for name in CLIENTS:
            print(f"\n== {name}", flush=True)
            rc = subprocess.run(
                [sys.executable, str(SAMPLES / "clients" / name), "--endpoint", endpoint],
                cwd=ROOT,
                env=env,
                check=False,
            ).returncode
            if rc != 0:
                failures.append(name)
        print("\n== summary:", "all sample clients succeeded" if not failures else f"FAILED: {failures}")
        return 1 if failures else 0
    finally:
        rc = stop(proc)
        print(f"== gateway stopped (exit code {rc})", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
