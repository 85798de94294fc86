"""A soak run: one real gateway with its workers under mixed load on every protocol, a worker
killed and the config reloaded on a schedule, and the processes' memory, file descriptors
and the loop's tasks sampled throughout.

The load (one thread per kind of caller, each paced so the run stays a background load on a
shared machine):

* ``eas``: ``PredictClient`` on the python ``echo`` service (the answer is the body);
* ``v1``, ``v2``, ``paddle``, ``cluster_serving``: the REST paths of the ``digits`` ONNX
  service, each answer's label checked against ONNX Runtime's own for that row;
* ``grpc``: V2 ``ModelInfer`` on the same service;
* ``queue``: puts on the ``jobs`` queue, read back by a watcher of one consumer group that
  commits each record;
* ``async_eas``: puts on the asynchronous ``aecho`` service's input queue, results read by a
  watcher on its sink;
* ``async_cs``: Cluster Serving's ``InputQueue.enqueue`` on the asynchronous ``adigits``
  service, results read by a watcher on its sink.

Every call is one record: ``{"p": kind, "t0", "t1", "ok", "status", "error"}`` (monotonic
times); queue and asynchronous puts add their value and request id, and the watchers record
what they read. Faults are ``{"kind": "kill"|"reload", "service", "start", "end"}`` where
``end`` is when the service is served again (the new worker ready, the reload applied).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import psutil
import yaml
from sklearn.datasets import load_digits

from eas_sdk import PredictClient, QueueClient
from eas_sdk.cluster_serving import InputQueue, decode_result
from eas_sdk.errors import PredictException
from gateway._proto import grpc_service_pb2 as pb
from gateway._proto import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.gateway_proc import DIGITS_MODEL, ECHO_ENTRY, GatewayProcess

TOKEN = "soak-token-4f7c2a9e1b6d3085"
ADMIN_TOKEN = "soak-admin-token-9a1e5c7b3d"
# Services the kills take turns on; ``digits`` (every REST and gRPC path) is never killed,
# so its worker's memory is one series over the whole run.
KILLED = ("echo", "aecho", "adigits")
SERVICES = ("digits", "echo", "aecho", "adigits")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(grpc_port: int, admin_port: int, extra: bool) -> dict[str, Any]:
    common = {"token": TOKEN, "workers": 1}
    services: list[dict[str, Any]] = [
        {"name": "digits", "processor": "onnx", "placement": "process", "model": str(DIGITS_MODEL), **common},
        {"name": "echo", "processor": "python", "entry": ECHO_ENTRY, **common},
        {"name": "aecho", "processor": "python", "entry": ECHO_ENTRY, "async": True, **common},
        {
            "name": "adigits",
            "processor": "onnx",
            "placement": "process",
            "model": str(DIGITS_MODEL),
            "async": True,
            **common,
        },
        {"name": "jobs", "processor": "queue", "token": TOKEN},
    ]
    if extra:  # what a reload adds and the next one removes
        services.append({"name": "echo2", "processor": "python", "entry": ECHO_ENTRY, **common})
    return {
        "gateway": {"grpc_port": grpc_port, "worker_start_timeout_s": 60},
        "admin": {"host": "127.0.0.1", "port": admin_port, "token": ADMIN_TOKEN},
        "services": services,
    }


# What one call gave: answered well, its status, what went wrong.
Outcome = tuple[bool, int | None, str | None]


class History:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._out = path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []

    def add(self, **event: Any) -> None:
        with self._lock:
            self.events.append(event)
            self._out.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._out.close()


class Http:
    """One keep-alive connection, opened again after any failure."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", path, body=body, headers=headers)
            resp = self.conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if resp.will_close:
            self.close()
        return resp.status, data

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class Sample:
    t: float
    pid: int
    role: str  # "gateway" or the worker's service
    rss_mb: float
    fds: int
    tasks: int | None = None


@dataclass
class Soak:
    gw: GatewayProcess
    workdir: Path
    grpc_port: int
    admin_port: int
    duration_s: float
    fault_every_s: float
    sample_every_s: float
    pace_s: float = 0.05
    # Queue and asynchronous puts go slower: every record a queue removes is remembered by the
    # queue store (its last 100,000 request ids, checker.py), memory that grows with them by
    # design; a couple a second keeps that growth small beside the bound.
    queue_pace_s: float = 0.5
    history: History = field(init=False)
    samples: list[Sample] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    drained: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.history = History(self.workdir / "history.jsonl")
        # Ten rows of scikit-learn's bundled digits: the answers' labels are checked per row.
        self.rows = load_digits().data[:10].astype(np.float32)
        sess = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
        self.labels = [int(x) for x in sess.run(["label"], {"input": self.rows})[0]]
        self.auth = {"Authorization": TOKEN}
        self._threads: list[threading.Thread] = []
        # Written as they are taken, beside the history: a run can be judged again.
        self._samples_out = (self.workdir / "samples.jsonl").open("a", encoding="utf-8", buffering=1)
        self._watchers: list[Any] = []

    # ------------------------------------------------------------------ one caller
    def _loop(self, name: str, call: Callable[[int], Outcome], pace_s: float | None = None) -> None:
        pace = self.pace_s if pace_s is None else pace_s
        n = 0
        while not self.stopping.is_set():
            n += 1
            t0 = time.monotonic()
            try:
                ok, status, error = call(n)
            except Exception as exc:  # every failure is a record, judged afterwards
                ok, status, error = False, getattr(exc, "code", None), f"{type(exc).__name__}: {exc}"[:200]
                if not isinstance(status, int):
                    status = None
            self.history.add(p=name, t0=t0, t1=time.monotonic(), ok=ok, status=status, error=error)
            self.stopping.wait(pace)

    def _row(self, n: int) -> tuple[list[float], int]:
        i = n % len(self.rows)
        return [float(x) for x in self.rows[i]], self.labels[i]

    def _checked(self, status: int, got: int | None, want: int, data: bytes) -> tuple[bool, int, str | None]:
        if status != 200:
            return False, status, data[:200].decode(errors="replace")
        if got != want:
            return False, status, f"label {got}, ONNX Runtime says {want}"
        return True, status, None

    def eas(self) -> None:
        client = PredictClient(self.gw.endpoint, "echo")
        client.set_token(TOKEN)
        client.set_timeout(10_000)
        client.init()

        def call(n: int) -> tuple[bool, int | None, str | None]:
            body = f"soak-{n}".encode()
            got = bytes(client.predict(body))
            return (got == body), 200, None if got == body else f"answer {got[:40]!r}"

        try:
            self._loop("eas", call)
        finally:
            client.close()

    def rest(self, name: str) -> None:
        conn = Http(self.gw.port)
        hdrs = {**self.auth, "Content-Type": "application/json"}

        def call(n: int) -> tuple[bool, int | None, str | None]:
            row, want = self._row(n)
            if name == "v1":
                status, data = conn.post(
                    "/v1/models/digits:predict", json.dumps({"instances": [row]}).encode(), hdrs
                )
                got = json.loads(data)["predictions"][0]["label"] if status == 200 else None
            elif name == "v2":
                doc = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}]}
                status, data = conn.post("/v2/models/digits/infer", json.dumps(doc).encode(), hdrs)
                outs = {o["name"]: o for o in json.loads(data)["outputs"]} if status == 200 else {}
                got = outs["label"]["data"][0] if outs else None
            elif name == "paddle":
                doc = {"feed": [{"input": row}], "fetch": ["label"]}
                status, data = conn.post("/digits/prediction", json.dumps(doc).encode(), hdrs)
                got = int(np.ravel(json.loads(data)["result"]["label"])[0]) if status == 200 else None
            else:
                body = json.dumps({"instances": [{"input": row}]}).encode()
                status, data = conn.post("/api/cluster-serving/digits/predict", body, hdrs)
                got = int(np.ravel(json.loads(data)["predictions"][0]["label"])[0]) if status == 200 else None
            return self._checked(status, None if got is None else int(got), want, data)

        try:
            self._loop(name, call)
        finally:
            conn.close()

    def grpc_calls(self) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            def call(n: int) -> tuple[bool, int | None, str | None]:
                row, want = self._row(n)
                req = pb.ModelInferRequest(model_name="digits")
                req.inputs.add(name="input", datatype="FP32", shape=[1, 64])
                req.raw_input_contents.append(np.asarray(row, np.float32).tobytes())
                try:
                    resp = stub.ModelInfer(req, metadata=(("authorization", TOKEN),), timeout=10)
                except grpc.RpcError as exc:
                    code = exc.code()  # type: ignore[attr-defined]
                    return False, None, f"grpc {code.name}: {exc.details()}"[:200]  # type: ignore[attr-defined]
                names = [o.name for o in resp.outputs]
                got = int(np.frombuffer(resp.raw_output_contents[names.index("label")], np.int64)[0])
                return self._checked(200, got, want, b"")

            self._loop("grpc", call)

    # ------------------------------------------------------------------ queues
    def _queue(self, service: str, uid: str) -> QueueClient:
        q = QueueClient(self.gw.endpoint, service)
        q.set_token(TOKEN)
        q.set_timeout(10_000)
        q.init(uid=uid, gid="soak")
        return q

    def produce(self, name: str) -> None:
        """``queue``: puts on ``jobs``; ``async_eas``: inputs of ``aecho``; ``async_cs``:
        Cluster Serving instances for ``adigits``."""
        if name == "async_cs":
            iq = InputQueue(endpoint=self.gw.endpoint, name="adigits", token=TOKEN, timeout_ms=10_000)
            closer: Callable[[], None] = iq.close
        else:
            q = self._queue("jobs" if name == "queue" else "aecho", name)
            closer = q.close

        def call(n: int) -> tuple[bool, int | None, str | None]:
            value = f"{name}-{n}"
            if name == "async_cs":
                row, want = self._row(n)
                _index, rid = iq.enqueue(value, input=np.asarray(row, np.float32))
                self.history.add(p=name, f="put", value=value, rid=rid, want=want, t=time.monotonic())
            else:
                _index, rid = q.put(value.encode())
                self.history.add(p=name, f="put", value=value, rid=rid, t=time.monotonic())
            return True, 200, None

        try:
            self._loop(name, call, self.queue_pace_s)
        finally:
            closer()

    def watch(self, name: str, service: str) -> None:
        """Read ``service`` with a watcher of group ``soak``, committing every record."""
        q = self._queue(service, f"{name}-reader")
        try:
            while not self.drained.is_set():
                watcher = q.watch(0, window=32)
                self._watchers.append(watcher)
                try:
                    for rec in watcher.run():
                        tags = dict(rec.tags)
                        data = bytes(rec.data)
                        result: Any = data.decode(errors="replace")
                        if name == "async_cs":
                            decoded = decode_result(data, tags)
                            result = (
                                f"error {decoded}"
                                if isinstance(decoded, Exception)
                                else int(np.ravel(decoded["label"])[0])
                            )
                        self.history.add(
                            p=name, f="read", index=int(rec.index), rid=tags.get("requestId"),
                            status=tags.get("status"), result=result, t=time.monotonic(),
                        )  # fmt: skip
                        q.commit(int(rec.index))
                        if self.drained.is_set():
                            break
                except PredictException as exc:
                    # A watch cut (a restart of what serves it): recorded, then watched again.
                    self.history.add(p=name, f="watch_cut", error=str(exc)[:200], t=time.monotonic())
                    self.drained.wait(0.5)
                finally:
                    watcher.close()
        finally:
            q.close()

    # ------------------------------------------------------------------ faults
    def _service(self, name: str) -> dict[str, Any]:
        return self.gw.services().get(name, {})

    def kill_worker(self, service: str) -> None:
        workers = self.gw.wait_workers_ready(service, 1, timeout=60)
        victim = next(w["pid"] for w in workers if w.get("state") == "ready")
        start = time.monotonic()
        os.kill(victim, signal.SIGKILL)

        def back() -> bool:
            ws = self._service(service).get("workers", [])
            return any(w.get("state") == "ready" and w.get("pid") not in (None, victim) for w in ws)

        _wait(back, 60, f"a new {service} worker ready")
        self.faults.append({"kind": "kill", "service": service, "start": start, "end": time.monotonic()})

    def reload(self, n: int) -> None:
        """Add ``echo2`` (or remove it) in the file and reload: SIGHUP and the admin API in turn."""
        extra = n % 2 == 0
        path = self.gw.workdir / "services.yaml"
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        fresh = config(self.grpc_port, self.admin_port, extra)
        doc["services"] = fresh["services"]
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        start = time.monotonic()
        how = "SIGHUP" if n % 2 == 0 else "POST /admin/reload"
        if how == "SIGHUP":
            os.kill(self.gw.pid, signal.SIGHUP)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=60)
            try:
                conn.request("POST", "/admin/reload", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                resp = conn.getresponse()
                answer = resp.read()
                assert resp.status == 200, (resp.status, answer)
            finally:
                conn.close()

        def applied() -> bool:
            svc = self.gw.services().get("echo2")
            if not extra:
                return svc is None
            return svc is not None and any(w.get("state") == "ready" for w in svc.get("workers", []))

        _wait(applied, 60, f"the reload ({how}) applied")
        self.faults.append(
            {"kind": "reload", "service": "echo2", "how": how, "start": start, "end": time.monotonic()}
        )

    def schedule(self, t_start: float) -> None:
        """A fault every ``fault_every_s``: kills of each killed service in turn, a reload between."""
        n = 0
        while not self.stopping.wait(max(0.0, t_start + (n + 1) * self.fault_every_s - time.monotonic())):
            if time.monotonic() > t_start + self.duration_s - self.fault_every_s / 2:
                break  # the run's last stretch is left without a fault: recovery is judged
            if n % 2 == 0:
                self.kill_worker(KILLED[(n // 2) % len(KILLED)])
            else:
                self.reload(n // 2)
            n += 1

    # ------------------------------------------------------------------ sampling
    def _tasks(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, StopIteration):
            conn = http.client.HTTPConnection("127.0.0.1", self.gw.port, timeout=10)
            try:
                conn.request("GET", "/metrics")
                text = conn.getresponse().read().decode()
            finally:
                conn.close()
            line = next(x for x in text.splitlines() if x.startswith("easgw_asyncio_tasks "))
            return int(float(line.split()[1]))
        return None

    def sample(self) -> None:
        while not self.stopping.is_set():
            t = time.monotonic()
            roles = {}
            with contextlib.suppress(Exception):
                for name, svc in self.gw.services().items():
                    for w in svc.get("workers", []):
                        if w.get("pid"):
                            roles[int(w["pid"])] = name
            procs = [(self.gw.pid, "gateway"), *sorted(roles.items())]
            tasks = self._tasks()
            for pid, role in procs:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(pid)
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue  # killed, not yet reaped: nothing of it is held any more
                    rss = p.memory_info().rss / 2**20
                    own = tasks if role == "gateway" else None
                    sample = Sample(t, pid, role, rss, p.num_fds(), own)
                    self.samples.append(sample)
                    self._samples_out.write(json.dumps(sample.__dict__) + "\n")
            self.stopping.wait(self.sample_every_s)

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        callers: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            (self.eas, ()),
            (self.rest, ("v1",)),
            (self.rest, ("v2",)),
            (self.rest, ("paddle",)),
            (self.rest, ("cluster_serving",)),
            (self.grpc_calls, ()),
            (self.produce, ("queue",)),
            (self.produce, ("async_eas",)),
            (self.produce, ("async_cs",)),
        ]
        watchers = [("queue", "jobs"), ("async_eas", "aecho/sink"), ("async_cs", "adigits/sink")]
        t_start = time.monotonic()
        self.history.add(p="soak", f="start", t=t_start)
        threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in callers]
        readers = [threading.Thread(target=self.watch, args=w, daemon=True) for w in watchers]
        sampler = threading.Thread(target=self.sample, daemon=True)
        for t in [*threads, *readers, sampler]:
            t.start()
        try:
            self.schedule(t_start)
            self.stopping.wait(max(0.0, t_start + self.duration_s - time.monotonic()))
        finally:
            self.stopping.set()
            for t in [*threads, sampler]:
                t.join(30)
            self.history.add(p="soak", f="end", t=time.monotonic())
            self._drain()
            self.drained.set()
            for w in list(self._watchers):
                with contextlib.suppress(Exception):
                    w.close()
            for t in readers:
                t.join(30)
            self.history.close()
            self._samples_out.close()

    def _drain(self, timeout: float = 60.0, quiet: float = 2.0) -> None:
        """Until every acknowledged put has been read (or ``timeout``), then ``quiet`` more."""

        def read_all() -> bool:
            evs = list(self.history.events)
            puts = {(e["p"], e["rid"]) for e in evs if e.get("f") == "put"}
            reads = {(e["p"], e["rid"]) for e in evs if e.get("f") == "read"}
            # The plain queue's records carry no request id tag: compare by value.
            put_values = {e["value"] for e in evs if e.get("f") == "put" and e["p"] == "queue"}
            read_values = {e["result"] for e in evs if e.get("f") == "read" and e["p"] == "queue"}
            return {x for x in puts if x[0] != "queue"} <= reads and put_values <= read_values

        with contextlib.suppress(AssertionError):
            _wait(read_all, timeout, "every acknowledged put read")
        time.sleep(quiet)  # redeliveries after the last read, if any, are counted too


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s")
        time.sleep(0.2)


@contextlib.contextmanager
def started(workdir: Path) -> Iterator[tuple[GatewayProcess, int, int]]:
    grpc_port, admin_port = free_port(), free_port()
    gw = GatewayProcess.start(config(grpc_port, admin_port, extra=False), workdir / "gw", timeout=120)
    try:
        for name in SERVICES:
            gw.wait_workers_ready(name, 1, timeout=120)
        yield gw, grpc_port, admin_port
    finally:
        gw.kill()
