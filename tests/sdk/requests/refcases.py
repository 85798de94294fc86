"""Cases shared by the byte-identity tests: built once, run by the reference in one process.

``apply(case)`` replays a case on eas_sdk's classes with the same tagged encoding the
reference driver uses (see ``ref_driver.py``); ``run_reference_cases`` runs a list of
cases under eas-prediction 0.36 in a single subprocess.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np

from eas_sdk.requests import BladeRequest, BladeTFRequest, StringRequest, TFRequest, TorchRequest
from tests.eas_reference import run_reference

DRIVER = (Path(__file__).with_name("ref_driver.py")).read_text()

F32_MAX = float(np.finfo(np.float32).max)
FLOATS = [0.0, -0.0, 1.5, -2.25, 1e-45, 1.17549435e-38, F32_MAX, -F32_MAX, 1e39, math.inf, -math.inf, 0.1, 3]
INT32S = [0, 1, -1, 127, 128, -128, 300, 2**31 - 1, -(2**31), 65535, -65536]
INT64S = [*INT32S, 2**63 - 1, -(2**63), 2**40, -(2**40) - 7]

# (dt, field values) for every TF dtype that carries values.
TF_DT_VALUES: dict[int, list[Any]] = {
    TFRequest.DT_FLOAT: FLOATS,
    TFRequest.DT_DOUBLE: [*FLOATS, 1e300, -5e-324],
    TFRequest.DT_INT8: [0, 1, -1, 127, -128],
    TFRequest.DT_INT16: [0, 1, -1, 32767, -32768],
    TFRequest.DT_INT32: INT32S,
    TFRequest.DT_UINT8: [0, 1, 127, 128, 255],
    TFRequest.DT_UINT16: [0, 1, 255, 65535],
    TFRequest.DT_QINT8: [0, -5, 100],
    TFRequest.DT_QUINT8: [0, 5, 200],
    TFRequest.DT_QINT16: [0, -300, 3000],
    TFRequest.DT_QUINT16: [0, 300, 60000],
    TFRequest.DT_QINT32: [0, -(2**31), 2**31 - 1],
    TFRequest.DT_INT64: INT64S,
    TFRequest.DT_BOOL: [True, False, True, True],
    TFRequest.DT_STRING: [b"", b"a", b"\x00\xff", "h\u00e9llo".encode(), b"x" * 200],
}
TORCH_DTS = [
    TorchRequest.DT_FLOAT,
    TorchRequest.DT_DOUBLE,
    TorchRequest.DT_INT8,
    TorchRequest.DT_INT16,
    TorchRequest.DT_INT32,
    TorchRequest.DT_UINT8,
    TorchRequest.DT_INT64,
]
NP_OF_DT = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    9: "int64",
    10: "bool",
    11: "int8",
    12: "uint8",
    13: "int32",
    15: "int16",
    16: "uint16",
    17: "uint16",
}
TF_FIELD = {1: "float_val", 2: "double_val", 9: "int64_val", 10: "bool_val", 7: "string_val"}
BLADE_FIELD = {1: "float_val", 2: "int_val", 3: "int64_val", 4: "string_val"}


def tf_field(dt: int) -> str:
    return TF_FIELD.get(dt, "int_val")


def enc(values: Any) -> Any:
    """Tagged JSON for the driver: bytes -> {"$b": hex}, ndarray -> {"$np": ...}."""
    if isinstance(values, np.ndarray):
        if values.dtype == object:
            return {"$np": ["bytes", [v.hex() for v in values.ravel().tolist()]]}
        return {"$np": [str(values.dtype), values.tolist()]}
    if isinstance(values, bytes):
        return {"$b": values.hex()}
    if isinstance(values, list):
        return [enc(v) for v in values]
    return values


def dec(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "$b" in obj:
            return bytes.fromhex(obj["$b"])
        if "$np" in obj:
            dtype, data = obj["$np"]
            if dtype == "bytes":
                return np.array([bytes.fromhex(x) for x in data], dtype=object)
            return np.array(data, dtype=dtype)
        return {k: dec(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [dec(v) for v in obj]
    return obj


def apply(case: list[Any]) -> bytes:
    """Build the same request with eas_sdk and return its bytes."""
    kind = case[0]
    if kind == "tf":
        req: Any = TFRequest(case[1]) if case[1] is not None else TFRequest()
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "fetch":
                req.add_fetch(op[1])
            elif op[0] == "sig":
                req.set_signature_name(op[1])
        return req.to_string()  # type: ignore[no-any-return]
    if kind == "torch":
        req = TorchRequest(case[1])
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "feed_map":
                req.add_feed_map(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "fetch":
                req.add_fetch(op[1])
            elif op[0] == "debug":
                req.set_debug_level(op[1])
        return req.to_string()  # type: ignore[no-any-return]
    if kind == "blade":
        req = BladeRequest(case[1])
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], op[4], dec(op[5]))
            elif op[0] == "fetch":
                req.add_fetch(op[1], op[2])
        return req.to_string()  # type: ignore[no-any-return]
    if kind == "blade_tf":
        req = BladeTFRequest(case[1])
        for op in case[2]:
            if op[0] == "feed":
                req.add_feed(op[1], op[2], op[3], dec(op[4]))
            elif op[0] == "fetch":
                req.add_fetch(op[1])
        return req.to_string()  # type: ignore[no-any-return]
    if kind == "string":
        return StringRequest(dec(case[1])).to_bytes()
    raise ValueError(kind)


def run_reference_cases(cases: list[list[Any]]) -> list[dict[str, Any]]:
    proc = run_reference(DRIVER, input_bytes=json.dumps(cases).encode(), timeout=120)
    results = json.loads(proc.stdout)
    assert len(results) == len(cases)
    return results  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- random cases
def _rand_shape(rng: random.Random, max_size: int = 24) -> list[int]:
    while True:
        shape = [rng.randint(0, 4) for _ in range(rng.randint(1, 4))]
        if math.prod(shape) <= max_size:
            return shape


def _rand_values(rng: random.Random, dt: int, n: int) -> list[Any]:
    if dt in (1, 2):
        pool = TF_DT_VALUES[dt] + [rng.uniform(-1e6, 1e6) for _ in range(4)]
        return [rng.choice(pool) for _ in range(n)]
    if dt == 7:
        return [bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))) for _ in range(n)]
    if dt == 10:
        return [rng.random() < 0.5 for _ in range(n)]
    return [rng.choice(TF_DT_VALUES.get(dt, INT32S)) for _ in range(n)]


def random_cases(seed: int, n_tf: int, n_torch: int, n_blade: int) -> list[list[Any]]:
    rng = random.Random(seed)
    cases: list[list[Any]] = []
    for _ in range(n_tf):
        ops: list[Any] = []
        for j in range(rng.randint(1, 3)):
            dt = rng.choice(list(TF_DT_VALUES))
            shape = _rand_shape(rng)
            ops.append(
                [
                    "feed",
                    f"in{j}_{rng.randint(0, 9)}",
                    shape,
                    dt,
                    enc(_rand_values(rng, dt, math.prod(shape))),
                ]
            )
        for _ in range(rng.randint(0, 2)):
            ops.append(["fetch", rng.choice(["out", "prob", "\u8f93\u51fa"])])
        cases.append(["tf", rng.choice(["serving_default", "s", "\u7b7e\u540d"]), ops])
    for _ in range(n_torch):
        ops = []
        for _ in range(rng.randint(1, 3)):
            dt = rng.choice(TORCH_DTS)
            shape = _rand_shape(rng)
            values = enc(_rand_values(rng, dt, math.prod(shape)))
            if rng.random() < 0.3:
                ops.append(["feed_map", rng.choice(["a", "b", "long_name"]), shape, dt, values])
            else:
                ops.append(["feed", rng.randint(0, 3), shape, dt, values])
        if rng.random() < 0.5:
            ops.append(["fetch", rng.choice([0, 1, 5, -1])])
        if rng.random() < 0.3:
            ops.append(["debug", rng.choice([1, 2, -3])])
        cases.append(["torch", rng.random() < 0.3, ops])
    for _ in range(n_blade):
        ops = []
        for j in range(rng.randint(1, 3)):
            dt = rng.choice([1, 2, 3, 4])
            shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
            n = math.prod(shape)
            tf_dt = {1: 1, 2: 3, 3: 9, 4: 7}[dt]
            ops.append(["feed", f"x{j}", rng.randint(1, 8), shape, dt, enc(_rand_values(rng, tf_dt, n))])
        for _ in range(rng.randint(0, 2)):
            ops.append(["fetch", rng.choice(["out", "y"]), rng.randint(0, 4)])
        cases.append(["blade", rng.choice(["", "sig", "serving_default"]), ops])
    return cases
