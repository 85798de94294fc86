"""Paddle Serving Op classes behind the gateway's op hooks: which classes are taken as Paddle
ops, what their hooks are given, and what their answers become."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.worker.ops import OpError, SkipModel, load_op
from gateway.worker.paddle_ops import PREDECESSOR, PaddleOp, is_paddle_op

OPS = Path(__file__).resolve().parents[2] / "processors" / "paddle_ops.py"


class GatewayStyle:
    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return inputs


class OnlyInit:
    def init_op(self) -> None:
        self.started = True


class PaddlePost:
    def postprocess(self, input_dicts: Any, fetch_dict: Any, data_id: int, log_id: int) -> Any:
        return {"n": len(fetch_dict)}, 0, ""


def test_paddle_ops_are_known_by_their_signatures() -> None:
    assert not is_paddle_op(GatewayStyle)
    assert is_paddle_op(OnlyInit)
    assert is_paddle_op(PaddlePost)
    assert isinstance(load_op(f"{OPS}:UciOp", {"k": 1}), PaddleOp)
    assert not isinstance(load_op(f"{__file__}:GatewayStyle", {}), PaddleOp)


def test_init_op_runs_and_missing_hooks_pass_values_through() -> None:
    op = load_op(f"{__file__}:OnlyInit", {"k": 1})
    assert op.op.started is True and op.config == {"k": 1}
    assert op.preprocess({"a": 1}) == {"a": 1}
    assert op.postprocess({"a": 1}, {"b": 2}) == {"b": 2}
    assert PaddleOp(PaddlePost()).postprocess({}, {"x": 1, "y": 2}) == {"n": 2}


def test_hooks_get_paddles_arguments() -> None:
    seen: list[Any] = []

    class Recorder:
        def preprocess(self, input_dicts: Any, data_id: int, log_id: int) -> Any:
            seen.append((input_dicts, data_id, log_id))
            return {}, False, None, ""

    PaddleOp(Recorder()).preprocess(
        {"text": np.array(["hello"], dtype=object), "raw": [b"bytes"], "x": np.ones((1, 2))}
    )
    ((dicts, data_id, log_id),) = seen
    assert list(dicts) == [PREDECESSOR]
    assert dicts[PREDECESSOR]["text"] == "hello"
    assert dicts[PREDECESSOR]["raw"] == "bytes"
    assert dicts[PREDECESSOR]["x"].shape == (1, 2)
    assert isinstance(data_id, int) and isinstance(log_id, int)


def test_is_skip_and_errcodes() -> None:
    op = load_op(f"{OPS}:UciOp", {})
    x = np.zeros((1, 13), np.float32)
    assert isinstance(op.preprocess({"x": x, "mode": "skip"}), SkipModel)
    assert not isinstance(op.preprocess({"x": x, "mode": "predict"}), SkipModel)
    with pytest.raises(OpError, match="errcode 7: the features are out of range") as info:
        op.preprocess({"x": x, "mode": "refuse"})
    assert info.value.status == 400
    with pytest.raises(OpError, match=r"returned a tuple of 2 \(dict, bool\)") as info:
        op.preprocess({"x": x, "mode": "short"})
    assert info.value.status == 500
    with pytest.raises(OpError, match="postprocess\\(\\) returned dict"):
        op.postprocess({"x": x, "mode": "bad-post"}, {"price": 1})
