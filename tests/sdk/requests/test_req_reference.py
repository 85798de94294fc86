"""Byte identity with the real eas-prediction 0.36 (run once, in one subprocess, for all cases).

Requests: every dtype of every request type, padding/map/fetch/debug/snappy for Torch,
fetch for Blade, merge quirks, unicode names, and a few hundred seeded random cases.
Responses: built by the reference's own protobuf 3.20.3 and decoded by us; our
``get_values``/``get_tensor_shape`` must answer like the reference's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from refcases import (
    BLADE_FIELD,
    NP_OF_DT,
    TF_DT_VALUES,
    TORCH_DTS,
    apply,
    dec,
    enc,
    random_cases,
    run_reference_cases,
    tf_field,
)

from eas_sdk.requests import BladeResponse, BladeTFResponse, TFResponse, TorchResponse

pytestmark = pytest.mark.compat

RECORDED_VECTORS = {
    "tf_vector": (
        ["tf", "predict_images", [["feed", "images", [1, 2], 1, [1.0, 2.0]], ["fetch", "scores"]]],
        "0a0e707265646963745f696d61676573121c0a06696d616765731212080112040a0201021a080000803f000000401a0673636f726573",
    ),
    "torch_vector": (
        ["torch", False, [["feed", 0, [1, 2], 1, [1.0, 2.0]], ["fetch", 0]]],
        "0a12080112040a0201021a080000803f00000040120100",
    ),
    "torch_snappy_vector": (
        ["torch", True, [["feed", 0, [1, 2], 1, [1.0, 2.0]]]],
        "144c0a12080112040a0201021a080000803f00000040",
    ),
    "blade_vector": (
        ["blade", "sig", [["feed", "in", 1, [1, 2], 1, [1.0, 2.0]], ["fetch", "out", 1]]],
        "0a03736967121a0a02696e1202696e180122040a0201022a080000803f000000401a0c0a036f757412036f75741801",
    ),
}


def _request_cases() -> dict[str, list[Any]]:
    cases: dict[str, list[Any]] = {k: v[0] for k, v in RECORDED_VECTORS.items()}
    for dt, values in TF_DT_VALUES.items():
        cases[f"tf_dt{dt}"] = ["tf", "sig", [["feed", "x", [len(values)], dt, enc(values)]]]
        cases[f"tf_dt{dt}_2d"] = [
            "tf",
            "s",
            [["feed", "x", [1, len(values)], dt, enc(values)], ["fetch", "y"]],
        ]
    for dt in TORCH_DTS:
        values = TF_DT_VALUES[dt]
        cases[f"torch_dt{dt}"] = ["torch", False, [["feed", 0, [len(values)], dt, enc(values)]]]
        cases[f"torch_dt{dt}_map"] = ["torch", False, [["feed_map", "m", [len(values), 1], dt, enc(values)]]]
    for dt, tf_dt in ((1, 1), (2, 3), (3, 9), (4, 7)):
        values = TF_DT_VALUES[tf_dt]
        cases[f"blade_dt{dt}"] = [
            "blade",
            "sig",
            [["feed", "in", 2, [len(values)], dt, enc(values)], ["fetch", "out", dt]],
        ]
    cases["blade_scalar_float"] = ["blade", "s", [["feed", "a", 1, [1], 1, 2.5]]]
    cases["blade_scalar_int32"] = ["blade", "s", [["feed", "a", 1, [1, 1], 2, -7]]]
    cases["blade_empty_sig_fetch_unknown"] = [
        "blade",
        "",
        [["feed", "a", 3, [2], 1, [1.0, 2]], ["fetch", "o", 0]],
    ]
    cases["blade_same_name_twice"] = [
        "blade",
        "s",
        [
            ["feed", "a", 1, [1], 2, [1]],
            ["feed", "a", 2, [2], 3, [2**40, -1]],
            ["fetch", "a", 3],
            ["fetch", "b", 4],
        ],
    ]
    for dt, tf_dt in ((1, 1), (2, 3), (3, 9), (4, 7)):
        values = TF_DT_VALUES[tf_dt]
        cases[f"blade_tf_dt{dt}"] = [
            "blade_tf",
            "predict_words",
            [["feed", "in", [1, len(values)], dt, enc(values)], ["feed", "n", [1], 2, 187], ["fetch", "out"]],
        ]
    cases["blade_tf_batch_from_shape"] = [
        "blade_tf",
        "s",
        [["feed", "x", [3, 2], 1, [0.8] * 6], ["fetch", "o"]],
    ]
    cases["tf_multi_inputs_order"] = [
        "tf",
        "serving_default",
        [
            ["feed", "zeta", [2], 1, [1.0, 2.0]],
            ["feed", "alpha", [1], 9, [5]],
            ["feed", "mid", [2], 7, enc([b"a", b"bc"])],
            ["fetch", "o1"],
            ["fetch", "o0"],
            ["fetch", "o1"],
        ],
    ]
    cases["tf_unicode"] = [
        "tf",
        "\u7b7e\u540d",
        [["feed", "\u8f93\u5165", [1], 1, [1.0]], ["fetch", "\u8f93\u51fa"]],
    ]
    cases["tf_empty_signature"] = ["tf", "", [["feed", "x", [1], 1, [1.0]]]]
    cases["tf_empty_input_name"] = ["tf", "s", [["feed", "", [1], 3, [1]]]]
    cases["tf_refeed_merges"] = ["tf", "s", [["feed", "x", [1], 3, [-1]], ["feed", "x", [2], 1, [2.0, 3.0]]]]
    cases["tf_sig_latched_at_feed"] = ["tf", "a", [["feed", "x", [1], 1, [1.0]], ["sig", "b"]]]
    cases["tf_sig_set_before_feed"] = ["tf", "a", [["sig", "b"], ["feed", "x", [1], 1, [1.0]]]]
    cases["tf_fetch_only_no_sig"] = ["tf", "a", [["fetch", "x"]]]
    cases["tf_zero_size"] = ["tf", "s", [["feed", "x", [0, 3], 1, []]]]
    cases["tf_scalar_shape"] = ["tf", "s", [["feed", "x", [], 1, [4.0]]]]
    cases["tf_numpy_content"] = ["tf", "s", [["feed", "x", [2, 2], 1, enc(np.arange(4, dtype=np.float32))]]]
    cases["tf_numpy_int64_into_int32"] = ["tf", "s", [["feed", "x", [3], 3, enc(np.array([1, -2, 3]))]]]
    cases["tf_big_float"] = [
        "tf",
        "s",
        [["feed", "x", [1, 3, 32, 32], 1, enc(np.linspace(-3, 3, 3072, dtype=np.float32))]],
    ]
    cases["torch_padding"] = ["torch", False, [["feed", 2, [1], 1, [1.0]], ["feed", 0, [1], 3, [7]]]]
    cases["torch_refeed_merges"] = ["torch", False, [["feed", 0, [1], 1, [1.0]], ["feed", 0, [1], 1, [2.0]]]]
    cases["torch_everything"] = [
        "torch",
        False,
        [
            ["feed", 1, [2], 9, [2**62, -1]],
            ["feed_map", "k2", [1], 1, [0.5]],
            ["feed_map", "k1", [2], 3, [1, -1]],
            ["fetch", 3],
            ["fetch", -1],
            ["fetch", 0],
            ["debug", 5],
        ],
    ]
    cases["torch_negative_debug"] = ["torch", False, [["debug", -2], ["feed", 0, [1], 1, [1.0]]]]
    cases["torch_snappy_big"] = [
        "torch",
        True,
        [["feed", 0, [1, 3, 64, 64], 1, enc(np.tile(np.arange(64, dtype=np.float32), 192))], ["fetch", 0]],
    ]
    cases["torch_snappy_map_random"] = [
        "torch",
        True,
        [["feed_map", "img", [4096], 1, enc(np.random.default_rng(3).random(4096, dtype=np.float32))]],
    ]
    cases["string_str"] = ["string", '[{"fea1": 1, "fea2": "\u00e9"}]']
    cases["string_bytes"] = ["string", enc(b"\x00\x01raw")]
    cases["string_empty"] = ["string", ""]
    for i, case in enumerate(random_cases(seed=20261122, n_tf=120, n_torch=80, n_blade=60)):
        cases[f"random_{case[0]}_{i}"] = case
    return cases


REQUEST_CASES = _request_cases()


def _tf_resp(dt: int, values: list[Any], name: str = "out") -> list[Any]:
    return [name, dt, [1, len(values)], tf_field(dt), enc(values)]


def _response_cases() -> dict[str, list[Any]]:
    cases: dict[str, list[Any]] = {}
    for dt, values in TF_DT_VALUES.items():
        cases[f"tf_resp_dt{dt}"] = ["tf_resp", [_tf_resp(dt, values)], ["out", "missing"]]
    cases["tf_resp_multi"] = [
        "tf_resp",
        [
            _tf_resp(1, [0.25, 0.75], "scores"),
            _tf_resp(9, [1, 2**40], "ids"),
            ["empty", 1, [0], "float_val", []],
        ],
        ["scores", "ids", "empty"],
    ]
    torch_pos = [[dt, [len(TF_DT_VALUES[dt])], tf_field(dt), enc(TF_DT_VALUES[dt])] for dt in TORCH_DTS]
    cases["torch_resp_all"] = [
        "torch_resp",
        torch_pos,
        [["m1", 1, [2, 1], "float_val", [1.0, 2.0]], ["m2", 9, [1], "int64_val", [-5]]],
    ]
    blade_outs = []
    blade_queries = []
    for dt, tf_dt in ((1, 1), (2, 3), (3, 9), (4, 7)):
        values = TF_DT_VALUES[tf_dt]
        blade_outs.append([f"o{dt}", 2, [len(values)], BLADE_FIELD[dt], enc(values)])
        blade_queries.append([f"o{dt}", dt])
    blade_queries.append([" o1 ", 1])  # the original strips whitespace when matching names
    cases["blade_resp_all"] = ["blade_resp", blade_outs, blade_queries]
    return cases


RESPONSE_CASES = _response_cases()


@pytest.fixture(scope="module")
def reference_results() -> dict[str, dict[str, Any]]:
    names = list(REQUEST_CASES) + list(RESPONSE_CASES)
    cases = [*REQUEST_CASES.values(), *RESPONSE_CASES.values()]
    return dict(zip(names, run_reference_cases(cases), strict=True))


def test_recorded_reference_client_vectors_without_the_client() -> None:
    for name, (case, expected) in RECORDED_VECTORS.items():
        assert apply(case).hex() == expected, name


@pytest.mark.parametrize("name", list(REQUEST_CASES))
def test_request_bytes_identical(name: str, reference_results: dict[str, dict[str, Any]]) -> None:
    ref = reference_results[name]
    case = REQUEST_CASES[name]
    assert "err" not in ref, f"the reference should handle every case here: {ref}"
    ours = apply(case)
    assert ours.hex() == ref["hex"]
    if name in RECORDED_VECTORS:
        assert ref["hex"] == RECORDED_VECTORS[name][1]


def _same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN and -0.0 differs from 0.0 (bit-level for floats)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", [n for n in RESPONSE_CASES if n.startswith("tf_resp")])
def test_tf_response_decoding_matches_reference(
    name: str, reference_results: dict[str, dict[str, Any]]
) -> None:
    ref = reference_results[name]
    assert "err" not in ref, ref
    resp = TFResponse(bytes.fromhex(ref["hex"]))
    outputs = {o[0]: o for o in RESPONSE_CASES[name][1]}
    for query, (ref_values, ref_shape) in ref["answers"].items():
        assert resp.get_tensor_shape(query) == ref_shape
        ours = resp.get_values(query)
        if ref_values is None and query in outputs:
            # The original returns None for UINT8/UINT16/QINT outputs; we return the ints.
            dt = outputs[query][1]
            assert dt in (4, 11, 12, 13, 15, 16, 17), dt
            assert ours == dec(outputs[query][4])
            continue
        assert _same(ours, dec(ref_values)), (query, ours, ref_values)
        if query in outputs:
            arr = resp.to_numpy(query)
            assert arr.shape == tuple(ref_shape)
            dt = outputs[query][1]
            if dt != 7:
                assert arr.dtype == np.dtype(NP_OF_DT[dt])
                with np.errstate(over="ignore"):  # 1e39 -> inf, as protobuf stored it
                    expect = np.array(dec(outputs[query][4]), dtype=NP_OF_DT[dt]).reshape(ref_shape)
                assert np.array_equal(arr, expect, equal_nan=arr.dtype.kind == "f")
            else:
                assert arr.ravel().tolist() == dec(outputs[query][4])


def test_torch_response_decoding_matches_reference(reference_results: dict[str, dict[str, Any]]) -> None:
    ref = reference_results["torch_resp_all"]
    assert "err" not in ref, ref
    resp = TorchResponse(bytes.fromhex(ref["hex"]))
    case = RESPONSE_CASES["torch_resp_all"]
    assert len(resp) == len(case[1])
    for i, (ref_values, ref_shape) in enumerate(ref["answers"]["pos"]):
        assert resp.get_tensor_shape(i) == ref_shape
        assert _same(resp.get_values(i), dec(ref_values)), i
        dt = case[1][i][0]
        arr = resp.to_numpy(i)
        assert arr.dtype == np.dtype(NP_OF_DT[dt]) and arr.shape == tuple(ref_shape)
    for key, (ref_values, ref_shape) in ref["answers"]["map"].items():
        assert resp.get_tensor_shape_map(key) == ref_shape
        assert _same(resp.get_values_map(key), dec(ref_values))
        assert resp.to_numpy(key).shape == tuple(ref_shape)
    assert resp.get_values_map("nope") is None and resp.get_tensor_shape_map("nope") == []
    with pytest.raises(IndexError):
        resp.get_values(len(case[1]))


def test_blade_response_decoding_matches_reference(reference_results: dict[str, dict[str, Any]]) -> None:
    ref = reference_results["blade_resp_all"]
    assert "err" not in ref, ref
    resp = BladeResponse(bytes.fromhex(ref["hex"]))
    for (qname, dt), (ref_values, ref_shape) in zip(
        RESPONSE_CASES["blade_resp_all"][2], ref["answers"], strict=True
    ):
        assert resp.get_tensor_shape(qname) == ref_shape
        assert _same(resp.get_values(qname, dt), dec(ref_values)), qname
        arr = resp.to_numpy(qname)
        assert arr.shape == tuple(ref_shape)
    tf_resp = BladeTFResponse(bytes.fromhex(ref["hex"]))
    for (qname, _), ref_values in zip(RESPONSE_CASES["blade_resp_all"][2], ref["tf_answers"], strict=True):
        assert _same(tf_resp.get_values(qname), dec(ref_values)), qname
    assert resp.to_numpy("o1").dtype == np.float32
    assert resp.to_numpy("o2").dtype == np.int32
    assert resp.to_numpy("o3").dtype == np.int64
    assert resp.to_numpy("o4").dtype == object
