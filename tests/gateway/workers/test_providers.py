"""Choosing ONNX Runtime execution providers per service."""

from __future__ import annotations

import logging

import pytest

from gateway.worker.processors.base import LoadError
from gateway.worker.processors.onnx import choose_providers


def test_the_wanted_order_is_kept_and_missing_ones_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    available = ["CPUExecutionProvider", "CUDAExecutionProvider"]
    assert choose_providers("s", ("CUDAExecutionProvider", "CPUExecutionProvider"), available) == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert not caplog.records
    got = choose_providers("s", ("TensorrtExecutionProvider", "CPUExecutionProvider"), available)
    assert got == ["CPUExecutionProvider"]
    assert "service s: TensorrtExecutionProvider not available" in caplog.text


def test_none_available_is_a_load_error() -> None:
    with pytest.raises(LoadError, match="none of the execution providers CUDAExecutionProvider is available"):
        choose_providers("s", ("CUDAExecutionProvider",), ["CPUExecutionProvider"])
