"""The load of a fault run, through our SDK, recording a history of every operation.

Run inside the client's namespace: ``python -m tests.faults.loadgen SPEC.json``. It keeps

* one producer per gateway in ``put_via``: ``QueueClient.put`` of a unique value each time
  (the SDK sends one request id per put and repeats it on its retries);
* one consumer of group ``check`` on ``watch_via``: a watch with a window, committing each
  record it reads (it stops reading while the file ``consumer_pause`` names exists);
* one caller of the predict service per gateway in ``predict_via`` with ``PredictClient``;
* with ``async_via``: one producer of inputs to the asynchronous service there (a put of a
  unique value, its request id recorded) and one watcher of its sink, so the checker can
  match every result to its input by request id and content;

until the file ``stop`` names appears. Then the producers and the caller stop and the
consumer drains: it reads on until it has seen every acknowledged value and nothing new
came for ``quiet_s``, or ``drain_s`` passed.

Every operation is one JSON line in ``history``, written as it completes (a run killed
half-way leaves a readable prefix): ``{"p": process, "f": put|read|commit|predict,
"type": ok|fail|info, "t0": invoke, "t1": completion, ...}`` (``aput`` and ``aread`` for the
asynchronous service's inputs and results) with monotonic times (one
clock for the whole machine, so the suite's fault times compare with them). ``info`` is
an operation whose outcome is unknown (a put that failed after it may have reached the
server).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from eas_sdk import PredictClient, QueueClient
from eas_sdk.errors import ClientHTTPError, PredictException, TransportError


class History:
    def __init__(self, path: Path) -> None:
        self._out = path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def add(self, **event: Any) -> None:
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._out.write(line + "\n")

    def close(self) -> None:
        self._out.close()


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def _kind(exc: BaseException) -> str:
    """``fail`` when the server refused the put for sure (a 4xx: nothing stored), ``info``
    when it may have stored it (a 5xx, a timeout, a dropped connection)."""
    if isinstance(exc, ClientHTTPError) and _status(exc) not in (408, 429):
        return "fail"
    return "info"


class Load:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.history = History(Path(spec["history"]))
        self.stop_file = Path(spec["stop"])
        self.stopping = threading.Event()
        self.acked: set[str] = set()
        self.seen: set[str] = set()
        self.async_acked: set[str] = set()  # request ids of inputs acknowledged
        self.async_seen: set[str] = set()  # request ids of results read
        self.last_read = time.monotonic()
        self.lock = threading.Lock()
        self.watcher: Any = None
        self.result_watcher: Any = None
        self.drained = threading.Event()

    def _queue_client(self, url: str, uid: str, queue: str | None = None) -> QueueClient:
        q = QueueClient(url, queue or self.spec["queue"])
        q.set_token(self.spec["token"])
        q.set_timeout(self.spec.get("timeout_ms", 3000))
        q.set_retry_count(self.spec.get("retries", 3))
        q.init(uid=uid, gid="check")
        return q

    # ------------------------------------------------------------------ producers
    def produce(self, name: str, url: str) -> None:
        self._put_until_stopped(self._queue_client(url, name), name, "put", name, url, self.acked)

    def _put_until_stopped(
        self,
        q: QueueClient,
        who: str,
        op: str,
        prefix: str,
        url: str,
        acked: set[str],
        *,
        by_rid: bool = False,
    ) -> None:
        """Put ``PREFIX-1``, ``PREFIX-2``, ... until the run stops, each an ``op`` event of ``who``
        in the history; ``acked`` takes an accepted record's value, or its request id where
        ``by_rid`` (an asynchronous result names only that)."""
        n = 0
        pause = self.spec.get("put_pause_s", 0.02)
        while not self.stopping.is_set():
            n += 1
            value = f"{prefix}-{n}"
            t0 = time.monotonic()
            try:
                index, rid = q.put(value.encode())
            except PredictException as exc:
                self.history.add(
                    p=who, f=op, type=_kind(exc), t0=t0, t1=time.monotonic(), value=value,
                    via=url, status=_status(exc), error=f"{type(exc).__name__}: {str(exc)[:160]}",
                )  # fmt: skip
            else:
                with self.lock:
                    acked.add(rid if by_rid else value)
                self.history.add(
                    p=who, f=op, type="ok", t0=t0, t1=time.monotonic(), value=value, via=url,
                    index=int(index), rid=rid,
                )  # fmt: skip
            time.sleep(pause)
        q.close()

    # ------------------------------------------------------------------ consumer
    def consume(self, url: str) -> None:
        q = self._queue_client(url, "consumer")
        watcher = q.watch(0, window=self.spec.get("window", 16))
        self.watcher = watcher
        pause = Path(self.spec.get("consumer_pause", "/nonexistent"))
        try:
            for rec in watcher.run():
                while pause.exists() and not self.drained.is_set():
                    time.sleep(0.02)  # a consumer that lags: what it has not read piles up
                t = time.monotonic()
                value = bytes(rec.data).decode(errors="replace")
                index = int(rec.index)
                with self.lock:
                    self.seen.add(value)
                    self.last_read = t
                self.history.add(p="consumer", f="read", type="ok", t0=t, t1=t, value=value, index=index)
                t0 = time.monotonic()
                try:
                    q.commit(index)
                except PredictException as exc:
                    self.history.add(
                        p="consumer", f="commit", type=_kind(exc), t0=t0, t1=time.monotonic(), index=index,
                        status=_status(exc), error=f"{type(exc).__name__}: {str(exc)[:160]}",
                    )  # fmt: skip
                else:
                    self.history.add(
                        p="consumer", f="commit", type="ok", t0=t0, t1=time.monotonic(), index=index
                    )
        except PredictException as exc:
            self.history.add(
                p="consumer", f="watch", type="fail", t0=time.monotonic(), t1=time.monotonic(), error=str(exc)
            )
        finally:
            q.close()

    # ------------------------------------------------------------------ asynchronous inference
    def produce_async(self, url: str) -> None:
        q = self._queue_client(url, "async", self.spec["async_service"])
        self._put_until_stopped(q, "async", "aput", "a", url, self.async_acked, by_rid=True)

    def read_results(self, url: str) -> None:
        """The sink, watched and committed: one ``aread`` per result delivered."""
        q = self._queue_client(url, "results", f"{self.spec['async_service']}/sink")
        while not self.drained.is_set():
            watcher = q.watch(0, window=self.spec.get("window", 16))
            self.result_watcher = watcher
            try:
                for rec in watcher.run():
                    t = time.monotonic()
                    tags = dict(rec.tags)
                    rid = tags.get("requestId", "")
                    with self.lock:
                        self.async_seen.add(rid)
                        self.last_read = t
                    self.history.add(
                        p="results", f="aread", type="ok", t0=t, t1=t, index=int(rec.index), rid=rid,
                        status=tags.get("status"), value=bytes(rec.data).decode(errors="replace"),
                    )  # fmt: skip
                    with contextlib.suppress(PredictException):
                        q.commit(int(rec.index))  # an uncommitted result comes again: counted
            except PredictException as exc:
                # A cut watch (the gateway paused, its link down): watched again.
                self.history.add(
                    p="results", f="watch", type="info", t0=time.monotonic(), t1=time.monotonic(),
                    error=str(exc)[:160],
                )  # fmt: skip
                time.sleep(0.3)
            finally:
                watcher.close()
        q.close()

    # ------------------------------------------------------------------ predict
    def predict(self, url: str, name: str = "predict") -> None:
        client = PredictClient(url, self.spec["service"])
        client.set_token(self.spec["token"])
        client.set_timeout(self.spec.get("predict_timeout_ms", 4000))
        client.set_retry_count(self.spec.get("predict_retries", 1))
        client.init()
        n = 0
        while not self.stopping.is_set():
            n += 1
            body = f"pred-{n}".encode()
            t0 = time.monotonic()
            try:
                got = client.predict(body)
            except TransportError as exc:
                self.history.add(
                    p=name, f="predict", type="info", t0=t0, t1=time.monotonic(), status=None, via=url,
                    error=f"{type(exc).__name__}: {str(exc)[:160]}",
                )  # fmt: skip
            except PredictException as exc:
                self.history.add(
                    p=name, f="predict", type="fail", t0=t0, t1=time.monotonic(), status=_status(exc),
                    via=url, error=f"{type(exc).__name__}: {str(exc)[:160]}",
                )  # fmt: skip
            else:
                ok = bytes(got) == body
                self.history.add(
                    p=name, f="predict", type="ok" if ok else "fail", t0=t0, t1=time.monotonic(),
                    status=200, via=url, error=None if ok else f"answer {bytes(got)[:40]!r} for {body!r}",
                )  # fmt: skip
            time.sleep(self.spec.get("predict_pause_s", 0.05))
        client.close()

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        threads = [
            threading.Thread(target=self.produce, args=(f"p{i}", url), daemon=True)
            for i, url in enumerate(self.spec["put_via"])
        ]
        predict_via = self.spec.get("predict_via") or []
        for i, url in enumerate([predict_via] if isinstance(predict_via, str) else predict_via):
            name = "predict" if i == 0 else f"predict{i}"
            threads.append(threading.Thread(target=self.predict, args=(url, name), daemon=True))
        readers = [threading.Thread(target=self.consume, args=(self.spec["watch_via"],), daemon=True)]
        if self.spec.get("async_via"):
            threads.append(
                threading.Thread(target=self.produce_async, args=(self.spec["async_via"],), daemon=True)
            )
            readers.append(
                threading.Thread(target=self.read_results, args=(self.spec["async_via"],), daemon=True)
            )
        for t in [*threads, *readers]:
            t.start()
        self.history.add(p="load", f="start", type="ok", t0=time.monotonic(), t1=time.monotonic())
        while not self.stop_file.exists():
            time.sleep(0.05)
        self.stopping.set()
        for t in threads:
            t.join(self.spec.get("join_s", 30))
        # Drain: every acknowledged value read, then quiet (redeliveries have settled).
        deadline = time.monotonic() + self.spec.get("drain_s", 30)
        quiet = self.spec.get("quiet_s", 1.5)
        while time.monotonic() < deadline:
            with self.lock:
                read = self.acked <= self.seen and self.async_acked <= self.async_seen
                done = read and time.monotonic() - self.last_read > quiet
            if done:
                break
            time.sleep(0.05)
        self.drained.set()
        for w in (self.watcher, self.result_watcher):
            if w is not None:
                w.close()
        for t in readers:
            t.join(10)
        with self.lock:
            missing = len(self.acked - self.seen) + len(self.async_acked - self.async_seen)
        self.history.add(
            p="load", f="end", type="ok", t0=time.monotonic(), t1=time.monotonic(), unread=missing
        )
        self.history.close()
        return 0


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    return Load(spec).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
