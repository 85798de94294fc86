"""Histories of fault runs that failed, kept once the cause was fixed: the checker must
still find in each what made it fail (``expect`` names the report's findings), so a
checker change cannot quietly stop catching it. Runs anywhere (no namespaces needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults.checker import Fault, check

DATA = Path(__file__).parent / "data"
KEPT = sorted(DATA.glob("*.json"))


@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
def test_the_checker_still_finds_what_failed(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    faults = [Fault(**f) for f in doc["faults"]]
    rep = check(doc["events"], faults)
    assert not rep.ok, f"{path.name}: the checker no longer finds: {doc['note']}"
    for finding in doc["expect"]:
        assert getattr(rep, finding), f"{path.name}: no {finding} found ({doc['note']})"


def test_a_clean_history_passes() -> None:
    """The checker's own baseline: puts read once each, in order, predicts all answered."""
    events: list[dict[str, object]] = [{"p": "load", "f": "start", "type": "ok", "t0": 0.0, "t1": 0.0}]
    for n in range(1, 21):
        t = n * 0.1
        events.append(
            {"p": "p0", "f": "put", "type": "ok", "t0": t, "t1": t + 0.01, "value": f"p0-{n}", "index": n}
        )
        events.append(
            {
                "p": "consumer",
                "f": "read",
                "type": "ok",
                "t0": t + 0.02,
                "t1": t + 0.02,
                "value": f"p0-{n}",
                "index": n,
            }
        )
        events.append({"p": "predict", "f": "predict", "type": "ok", "t0": t, "t1": t + 0.01, "status": 200})
    events.append({"p": "load", "f": "end", "type": "ok", "t0": 3.0, "t1": 3.0})
    rep = check(events, [Fault("nothing", 1.0, 1.05)])
    assert rep.ok and rep.acked_checked == 20 and not rep.lost


def test_the_checker_finds_a_loss_a_double_store_and_a_split_brain() -> None:
    def put(n: int, index: int, t: float) -> dict[str, object]:
        return {
            "p": "p0",
            "f": "put",
            "type": "ok",
            "t0": t,
            "t1": t + 0.01,
            "value": f"v{n}",
            "index": index,
        }

    def read(n: int, index: int, t: float) -> dict[str, object]:
        return {
            "p": "consumer",
            "f": "read",
            "type": "ok",
            "t0": t,
            "t1": t,
            "value": f"v{n}",
            "index": index,
        }

    events = [
        put(1, 1, 0.1), read(1, 1, 0.2),
        put(2, 2, 0.3),  # never read: lost
        put(3, 3, 0.5), read(3, 3, 0.6), read(3, 4, 0.7),  # one value at two indexes
        put(4, 3, 0.8), read(4, 3, 0.9),  # index 3 again, after 3 was acknowledged: two writers
    ]  # fmt: skip
    rep = check(events, [])
    assert [s.split(" ")[0] for s in rep.lost] == ["v2"]
    assert rep.stored_twice == ["v3 at indexes [3, 4]"]
    assert any("index 3 holds" in s for s in rep.split_brain)
    assert any("v4 got index 3" in s for s in rep.split_brain)


def test_the_checker_matches_asynchronous_results_to_inputs_one_to_one() -> None:
    def aput(n: int) -> dict[str, object]:
        t = n * 0.1
        return {
            "p": "async",
            "f": "aput",
            "type": "ok",
            "t0": t,
            "t1": t + 0.01,
            "value": f"a-{n}",
            "rid": f"r{n}",
        }

    def aread(rid: str, value: str, index: int) -> dict[str, object]:
        return {"p": "results", "f": "aread", "type": "ok", "t0": 1.0, "t1": 1.0, "rid": rid, "value": value,
                "index": index, "status": "200"}  # fmt: skip

    events = [
        *(aput(n) for n in range(1, 7)),
        aread("r1", "a-1", 1), aread("r1", "a-1", 1),  # read again at its index: counted, fine
        aread("r2", "a-2", 2),
        aread("r3", "a-3", 3), aread("r3", "a-3", 4),  # one request id at two sink indexes
        aread("r4", "a-5", 5),  # another input's result
        aread("r9", "a-9", 6),  # a result no input had
        aread("r6", "a-6", 7),
    ]  # fmt: skip
    rep = check(events, [])
    assert rep.async_acked == 6 and rep.async_matched == 3 and rep.async_redelivered == 1
    assert rep.async_lost == ["a-5 (r5)"]
    assert rep.async_stored_twice == ["a-3 (r3) at sink indexes [3, 4]"]
    assert rep.async_mismatched == ["a-4 (r4) answered 'a-5'"]
    assert rep.async_phantoms == ["r9: 'a-9'"]
    assert not rep.ok
