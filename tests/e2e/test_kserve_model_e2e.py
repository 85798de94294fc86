"""An existing ``kserve.Model`` subclass served unchanged by a ``python`` service where the
kserve package is installed: ``load``, ``preprocess``, ``predict`` (async), ``postprocess``
and ``explain`` run as KServe's model server runs them (its own ``Model.__call__``), over
KServe V1 and EAS calls. The gateway's environment has not the kserve package, so the real
routes and processor run in one process under .venv-clients (clients/kserve_model_inproc.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import ROOT
from tests.e2e.test_kserve_clients_e2e import run_client


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out: Path = tmp_path_factory.mktemp("kserve-model")
    run_client(".venv-clients", "kserve_model_inproc.py", str(ROOT), str(out))
    return dict(json.loads((out / "results.json").read_text()))


def test_predict_and_explain_run_as_kserve_runs_them(results: dict[str, Any]) -> None:
    predicted = {"predictions": [[3.0, -6.0], [1.5, 1.5]], "model": "scaler", "loaded": True}
    assert results["predict"] == [200, predicted]
    status, body = results["explain"]
    assert status == 200 and body["explanations"] == [[0.333, 0.667], [0.5, 0.5]]
    assert body["model"] == "scaler"  # postprocess ran after explain, as KServe runs it
    assert results["eas"] == [200, predicted]  # the EAS path: the same model, the same answer
    assert set(results["models"]["models"]) == {"scaler", "plain"}


def test_what_such_a_model_refuses(results: dict[str, Any]) -> None:
    status, body = results["bad_payload"]
    assert status == 400 and "expected {'instances': [...]}" in body["error"], body
    status, body = results["no_explainer"]
    assert status == 404 and "'plain' has no explainer" in body["error"], body
    status, body = results["v2"]
    assert status == 404 and "served over KServe V1" in body["error"], body
    assert results["no_token"][0] == 401
