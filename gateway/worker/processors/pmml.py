"""PMML processor: a PMML file (``model: scorecard.pmml``), evaluated in Python by
sklearn-pmml-model (docs/processors.md says why that evaluator and what it covers).

The file says its fields: the DataDictionary's fields other than the target are the model's
features, in their order. Two ways in:

* the EAS form of a PMML service (the guide's ``StringRequest('[{"fea1": 1, "fea2": 2}]')``):
  a JSON list of records, one object per row with a value for every feature by name, answered
  as a JSON list with one object per row: the target's value under the target's name and,
  for a classification, ``probability(<class>)`` for each class (the names JPMML gives);
* every tensor form (EAS TF/Torch/Blade, the JSON ``inputs`` form, KServe V1/V2, gRPC):
  one input ``input`` of shape ``[-1, features]`` (as KServe's PMML server takes it), in FP64,
  or BYTES when a feature is a string field; outputs ``predict`` and, for a classification,
  ``predict_proba`` (one column per class, in the model's class order).

Rows are independent, so requests are batched along them (``batching``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from eas_sdk.codecs import eas
from gateway.core.calls import TensorRequest, WorkerRequest, WorkerResponse
from gateway.worker.processors.base import JSON, LoadError, ProcessorError
from gateway.worker.processors.estimator import EstimatorProcessor, Method
from gateway.worker.processors.model import Prepared

try:  # orjson comes with the gateway extra; the standard library otherwise
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None

RECORDS = "records"  # the decoded kind of a JSON list of records
# PMML dataTypes whose values are text; every other one is a number here.
_TEXT_TYPES = {"string"}
MAX_RECORDS = 1 << 20


def _loads(body: bytes) -> Any:
    try:
        return _orjson.loads(body) if _orjson is not None else json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise ProcessorError("cannot decode request as a JSON list of records") from None


def _dumps(doc: Any) -> bytes:
    if _orjson is not None:
        return _orjson.dumps(doc)  # JSON has no NaN: orjson writes a probability's as null
    return json.dumps(doc).encode()


def _plain(value: Any) -> Any:
    """A numpy scalar as JSON writes it (NaN as null: JSON has none)."""
    v = value.item() if isinstance(value, np.generic) else value
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class PmmlProcessor(EstimatorProcessor):
    platform = "pmml"
    default_dtype = "FP64"
    expects = "a PMML file (PMML 4.x XML, read by sklearn-pmml-model)"

    def load_model(self, path: str) -> None:
        from sklearn_pmml_model.auto_detect import auto_detect_estimator

        model: Any = auto_detect_estimator(pmml=path)
        target = model.target_field
        if target is None:
            raise LoadError(f"{Path(path).name}: the PMML names no target field (MiningSchema)")
        self.model = model
        self.target = str(target.get("name"))
        fields = [(n, e) for n, e in model.fields.items() if e is not target and e.tag == "DataField"]
        self.features = [str(n) for n, _ in fields]
        self.text = {str(n) for n, e in fields if e.get("dataType") in _TEXT_TYPES}
        if self.text:
            self.default_dtype = "BYTES"
        self.classes = [_plain(c) for c in getattr(model, "classes_", ())]

    def n_features(self) -> int | None:
        return len(self.features)

    def _frame(self, x: np.ndarray) -> Any:
        """The rows as the evaluator takes them: a plain matrix when every feature is a
        number, else a table whose text columns stay text."""
        if not self.text:
            return x
        import pandas as pd

        frame = pd.DataFrame(x, columns=self.features)
        for name in self.features:
            col = frame[name]
            if name in self.text:
                frame[name] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in col]
            else:
                frame[name] = pd.to_numeric(col, errors="coerce")
        return frame

    def methods(self) -> dict[str, Method]:
        model = self.model
        out: dict[str, Method] = {"predict": lambda x: model.predict(self._frame(x))}
        if self.classes:
            out["predict_proba"] = lambda x: model.predict_proba(self._frame(x))
        return out

    # -- the EAS form: a JSON list of records --------------------------------------------

    def prepare(self, req: WorkerRequest) -> Prepared:
        if isinstance(req, TensorRequest) or not req.body[:64].lstrip().startswith(b"["):
            return super().prepare(req)
        rows = _loads(req.body)
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise ProcessorError("expected a JSON list of records: [{field: value, ...}, ...]")
        if len(rows) > MAX_RECORDS:
            raise ProcessorError(f"too many records ({len(rows)} > {MAX_RECORDS})")
        x = self._matrix(rows)
        indices, wanted = self._every
        decoded = eas.DecodedRequest(RECORDS)
        key = (RECORDS, x.dtype.str, x.shape[1:]) if self.supports_batching and len(rows) else None
        return Prepared(decoded, {self.inputs[0].name: x}, indices, wanted, len(rows), key)

    def _matrix(self, rows: list[dict[str, Any]]) -> np.ndarray:
        try:
            table = [[row[name] for name in self.features] for row in rows]
        except KeyError as exc:
            fields = ", ".join(self.features)
            what = f"input {exc.args[0]!r}: missing from a record; the model's fields: {fields}"
            raise ProcessorError(what) from None
        if self.text:
            x = np.empty((len(rows), len(self.features)), dtype=object)
            for j, name in enumerate(self.features):
                column = [r[j] for r in table]
                if name in self.text:
                    x[:, j] = [v if isinstance(v, bytes) else str(v).encode() for v in column]
                else:
                    x[:, j] = self._numbers(name, column)
            return x
        try:  # one conversion in C; a value that is not a number is looked for only then
            x = np.array(table, dtype=np.float64)
        except (TypeError, ValueError):
            for j, name in enumerate(self.features):
                self._numbers(name, [r[j] for r in table])
            x = np.empty(0)  # every value a number, yet no matrix: a value that is a list
        if x.ndim != 2:
            raise ProcessorError(f"expected one number per field in each record, got {str(rows[0])[:80]}")
        return x

    @staticmethod
    def _numbers(name: str, column: list[Any]) -> list[Any]:
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in column):
            raise ProcessorError(f"input {name!r}: expected numbers, got {column!r:.80}")
        return column

    def _encode(self, p: Prepared, results: list[np.ndarray]) -> WorkerResponse:
        if p.decoded.kind != RECORDS:
            return super()._encode(p, results)
        by_name = dict(zip(p.wanted, results, strict=True))
        labels = [_plain(v) for v in by_name["predict"].tolist()]
        proba = by_name.get("predict_proba")
        if proba is None:
            records = [{self.target: v} for v in labels]
        else:
            keys = [self.target, *(f"probability({c})" for c in self.classes)]
            records = [
                dict(zip(keys, (v, *ps), strict=True)) for v, ps in zip(labels, proba.tolist(), strict=True)
            ]
        return WorkerResponse(200, _dumps(records), JSON)


__all__ = ["RECORDS", "PmmlProcessor"]
