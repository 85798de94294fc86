"""Named values across the process boundary: arrays and plain Python values round-trip as
they were made, arrays are read in place (large ones from shared memory), and what cannot
cross is refused by name."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from gateway.codecs import pipeline_values as values
from gateway.codecs.shm import SHM_MIN, ShmArea, ShmWriter


def test_arrays_and_plain_values_round_trip() -> None:
    made = {
        "pixels": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
        "ids": np.array([[1, 2]], dtype=np.int64),
        "mask": np.array([True, False, True]),
        "complex": np.array([1 + 2j]),
        "empty": np.zeros((0, 3), dtype=np.float16),
        "scalar": np.float32(1.5),
        "words": np.array(["a", "bé"], dtype=object),
        "label": "cat",
        "count": 3,
        "big": 1 << 80,
        "none": None,
        "raw": b"\x00\xff",
        "info": {"tags": ["a", ("b", 2)], 7: {"nested": [1.5, None, True]}, ("k", 1): b"v"},
    }
    got, wanted, _ = values.decode(values.encode(made, ["label"]))
    assert wanted == ["label"] and list(got) == list(made)
    for name in ("pixels", "ids", "mask", "complex", "empty"):
        assert got[name].dtype == made[name].dtype and np.array_equal(got[name], made[name]), name
    assert type(got["scalar"]) is np.float32 and got["scalar"] == 1.5
    assert got["words"].dtype == object and got["words"].tolist() == ["a", "bé"]
    assert {k: got[k] for k in ("label", "count", "big", "none", "raw", "info")} == {
        k: made[k] for k in ("label", "count", "big", "none", "raw", "info")
    }
    assert type(got["raw"]) is bytes


def test_arrays_are_aligned_read_only_views_of_the_message() -> None:
    message = values.encode({"a": np.ones(3, dtype=np.int8), "b": np.arange(5, dtype=np.float64)})
    got = values.decode(message).values
    for arr in got.values():
        assert arr.base is not None and not arr.flags.writeable  # no copy: the message's bytes
        assert arr.ctypes.data % 8 == 0 or arr.dtype.itemsize == 1
    assert got["b"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_non_finite_floats_and_strided_arrays() -> None:
    strided = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    got = values.decode(values.encode({"s": strided, "f": [math.inf, math.nan]})).values
    assert got["s"].tolist() == strided.tolist()
    assert got["f"][0] == math.inf and math.isnan(got["f"][1])


def test_what_cannot_cross_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"info\['tags'\]\[1\]: cannot send a set"):
        values.encode({"info": {"tags": [1, {2}]}})
    with pytest.raises(TypeError, match="when: cannot send a datetime64"):
        values.encode({"when": np.datetime64("2024-01-01")})


@pytest.mark.parametrize("message", [b"", b"\x00\x00\x00\x05{}", b"\x00\x00\x00\x02{}"])
def test_a_malformed_message_is_a_value_error(message: bytes) -> None:
    with pytest.raises(ValueError, match="not a values message"):
        values.decode(message)


def test_a_value_outside_the_message_is_refused() -> None:
    message = values.encode({"a": np.ones(4, dtype=np.float32)})
    with pytest.raises(ValueError, match="outside the message"):
        values.decode(message[:-4])


def test_large_arrays_travel_in_shared_memory(tmp_path: Path) -> None:
    big = np.arange(SHM_MIN // 4 + 3, dtype=np.float32)
    small = np.ones(4, dtype=np.int64)
    writer = ShmWriter(str(tmp_path))
    message = values.encode({"big": big, "small": small}, ["y"], writer, "/answers/here")
    assert len(message) < 1024 and len(writer.made) == 1  # the big one is not in the message
    with pytest.raises(ValueError, match="outside the pipeline's directory"):
        values.decode(message)  # a reader maps only from the directory it knows
    got = values.decode(message, shm=str(tmp_path))
    assert got.wanted == ["y"] and got.shm == "/answers/here"
    assert np.array_equal(got.values["big"], big) and not got.values["big"].flags.writeable
    assert np.array_equal(got.values["small"], small)
    assert [p.name for p in tmp_path.iterdir()] == [Path(writer.made[0]).name]  # the sender's to remove
    again = values.decode(message, shm=str(tmp_path), unlink=True).values["big"]  # an answer, read
    assert not any(tmp_path.iterdir()) and np.array_equal(again, big)  # mapped: still readable
    with pytest.raises(ValueError, match="shared memory of the message is gone"):
        values.decode(message, shm=str(tmp_path))


@pytest.mark.parametrize("path", ["/etc/passwd", "{d}/../x", "{d}/..", "{d}/sub/x"])
def test_only_files_of_the_directory_are_mapped(tmp_path: Path, path: str) -> None:
    """A message may come from a direct caller of a worker: a file it names elsewhere is
    refused, never read."""
    (tmp_path / "x").write_bytes(bytes(16))  # a file the forged paths could reach
    head = json.dumps({"values": {"x": {"m": [path.format(d=tmp_path), "<f8", [2], 16]}}}).encode()
    forged = struct.pack("!I", len(head)) + head
    with pytest.raises(ValueError, match="outside the pipeline's directory"):
        values.decode(forged, shm=str(tmp_path))


def test_without_room_in_shared_memory_an_array_travels_in_the_message(tmp_path: Path) -> None:
    writer = ShmWriter(str(tmp_path / "missing"))
    big = np.zeros(SHM_MIN, dtype=np.uint8)
    message = values.encode({"big": big}, shm=writer)
    assert len(message) > SHM_MIN and not writer.made
    assert np.array_equal(values.decode(message).values["big"], big)


def test_an_area_is_private_and_removed_whole(tmp_path: Path) -> None:
    area = ShmArea.plan("p", root=tmp_path)
    assert area is not None and not Path(area.path).exists()  # made at start, not when planned
    assert area.open() and (Path(area.path).stat().st_mode & 0o777) == 0o700
    assert not area.open()  # a directory that is there already is not taken over
    ShmWriter(area.path).put(np.ones(8))
    area.close()
    assert not Path(area.path).exists()
    assert ShmArea.plan("p", root=tmp_path / "none") is None
