"""The Cluster Serving request parser under hostile input: every allocation follows from the
bytes received, images are refused from their header, and each refusal is a 4xx."""

from __future__ import annotations

import base64
import io
import json
import resource
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.codecs.cluster_serving import ClusterServingRequestError, parse_request


def _inputs(doc: Any, **kw: Any) -> dict[str, Any]:
    batch = parse_request(json.dumps(doc).encode(), **kw)
    return json.loads(batch.body)["inputs"]


def _refused(doc: Any, status: int = 400, **kw: Any) -> str:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(ClusterServingRequestError) as info:
        parse_request(body, **kw)
    assert info.value.status == status, str(info.value)
    return str(info.value)


def _png(width: int, height: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_explicit_float32_tensor_keeps_its_dtype() -> None:
    data = [0.5] * 64
    got = _inputs({"instances": [{"x": {"shape": [1, 64], "dtype": "float32", "data": data}}] * 2})
    assert got["x"] == {"shape": [2, 1, 64], "dtype": "float32", "data": data * 2}


@pytest.mark.parametrize("dtype", ["U100000000", "S1000000", "object", "V8", "complex128", "<f4", 7, None])
def test_explicit_dtype_outside_the_allow_list_is_400(dtype: Any) -> None:
    tracemalloc.start()
    try:
        message = _refused({"instances": [{"x": {"shape": [1], "dtype": dtype, "data": ["a"]}}]})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "is not one of" in message and "float32" in message
    # Refused before numpy made anything of the dtype ("U100000000" is 400 MB an element,
    # "S1000000" 1 MB): what is allocated follows from the body's few bytes.
    assert peak < 256 << 10, peak


@pytest.mark.parametrize(
    ("tensor", "fragment"),
    [
        ({"shape": [1 << 40, 1 << 40], "dtype": "float32", "data": [1.0]}, "does not match"),
        ({"shape": [2, 2], "dtype": "float32", "data": [1.0]}, "does not match"),
        ({"shape": [-1], "dtype": "float32", "data": [1.0]}, "non-negative"),
        ({"shape": "big", "dtype": "float32", "data": [1.0]}, "shape"),
        ({"shape": [1], "dtype": "int8", "data": [300]}, "do not fit"),
        ({"shape": [1], "dtype": "float32", "data": ["1.0"]}, "needs numbers"),
        ({"shape": [1], "dtype": "string", "data": [1]}, "needs string"),
    ],
)
def test_explicit_tensor_checked_against_its_values(tensor: dict[str, Any], fragment: str) -> None:
    assert fragment in _refused({"instances": [{"x": tensor}]})


def test_strings_never_become_fixed_width_unicode() -> None:
    # numpy's "U" dtype pads every element to the longest: 200,000 short strings next to one
    # of 100,000 characters would take 80 GB. As Python strings it is the body's size.
    words = ["a"] * 200_000 + ["b" * 100_000]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    got = _inputs({"instances": [{"w": words}]})
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert got["w"]["dtype"] == "string" and got["w"]["shape"] == [1, len(words)]
    assert grown_mb < 256


@pytest.fixture
def decoded_images(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """The images whose pixels Pillow decoded (its ImageFile.load), while the test runs."""
    from PIL import ImageFile

    decoded: list[object] = []
    load = ImageFile.ImageFile.load

    def counted(self: ImageFile.ImageFile) -> Any:
        decoded.append(self)
        return load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    yield decoded


def test_decompression_bomb_refused_from_its_header(decoded_images: list[object]) -> None:
    bomb = _png(9000, 9000)  # a few hundred kB of PNG, 243 MB of pixels
    message = _refused({"instances": [{"image": bomb}]}, 413)
    assert "9000 x 9000" in message
    message = _refused({"instances": [{"image": {"b64": bomb}}]}, 413)
    assert decoded_images == []  # not a pixel decoded
    small = _png(8, 8)  # the spy does see an image that is decoded
    assert _inputs({"instances": [{"image": small}]})["image"]["shape"] == [1, 8, 8, 3]
    assert decoded_images


def test_image_pixels_count_across_the_whole_request() -> None:
    img = _png(64, 64)
    assert len(_inputs({"instances": [{"i": img}] * 4}, max_image_pixels=4 * 64 * 64)["i"]["data"]) > 0
    _refused({"instances": [{"i": img}] * 5}, 413, max_image_pixels=4 * 64 * 64)


def test_deep_nesting_is_400() -> None:
    for depth in (40, 100_000):
        body = b'{"instances": [{"x": ' + b"[" * depth + b"1" + b"]" * depth + b"}]}"
        message = _refused(body)
        assert "dimensions" in message or "not valid JSON" in message


def test_mixed_and_ragged_values() -> None:
    assert "rectangular" in _refused({"instances": [{"x": [[1, 2], 3]}]})
    assert "one kind" in _refused({"instances": [{"x": [1, "a"]}]})
    assert "null" in _refused({"instances": [{"x": [1, None]}]})
    assert "kinds" in _refused({"instances": [{"x": [1]}, {"x": ["a"]}]})


def test_dense_values_keep_their_json_kind() -> None:
    got = _inputs({"instances": [{"i": [1, 2], "f": [1, 2.5], "b": [True], "s": "hi", "e": []}]})
    assert got["i"] == {"shape": [1, 2], "data": [1, 2]}
    assert got["f"] == {"shape": [1, 2], "data": [1.0, 2.5]}
    assert got["b"] == {"shape": [1, 1], "data": [True]}
    assert got["s"] == {"shape": [1], "dtype": "string", "data": ["hi"]}
    assert got["e"] == {"shape": [1, 0], "data": []}
    assert np.asarray(_inputs({"instances": [{"f": [1]}, {"f": [2.5]}]})["f"]["data"]).dtype.kind == "f"


# --- property tests: any JSON document is parsed or refused with a 4xx, nothing else -------

_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True), st.text(max_size=8),
    st.sampled_from(["float32", "U9999999", "string", "int8", "b64", "iVBORw0KGgo="]),
)  # fmt: skip
_JSON = st.recursive(
    _LEAF,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["shape", "dtype", "data", "indices", "b64", "path", "x"]), inner, max_size=4
        )
    ),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "b"]), _JSON, min_size=1, max_size=2), min_size=1, max_size=3
    )
)
def test_any_instances_parse_or_are_refused_with_a_4xx(instances: list[dict[str, Any]]) -> None:
    try:
        batch = parse_request(json.dumps({"instances": instances}).encode(), max_image_pixels=1 << 16)
    except ClusterServingRequestError as exc:
        assert 400 <= exc.status < 500
        return
    assert batch.size == len(instances)
    json.loads(batch.body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_are_refused_with_a_4xx(body: bytes) -> None:
    try:
        parse_request(body)
    except ClusterServingRequestError as exc:
        assert 400 <= exc.status < 500


def test_json_values_are_counted_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.codecs.cluster_serving as cluster_serving

    parsed: list[bytes] = []
    load = cluster_serving._load

    def counted(body: bytes) -> Any:
        parsed.append(body)
        return load(body)

    monkeypatch.setattr(cluster_serving, "_load", counted)
    body = b'{"instances": [{"w": [' + b'"ab",' * 1000 + b'"ab"]}]}'
    assert "more than 1000 JSON values" in _refused(body, 413, max_values=1000)
    assert parsed == []  # refused before the body was parsed
    assert _inputs({"instances": [{"w": ["ab"] * 999}]}, max_values=1000)["w"]["shape"] == [1, 999]
