"""Cluster Serving's top-N result on Redis (gateway.codecs.cluster_serving_arrow.top_n_result)
and its settings (``cluster_serving.top_n``, ``top_n_output``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from gateway.codecs.cluster_serving_arrow import top_n_result
from gateway.config import ConfigError, parse_config


def test_top_n_result_is_class_probability_pairs_most_probable_first() -> None:
    outputs = {"label": np.array(2), "probabilities": np.array([0.1, 0.2, 0.7], np.float32)}
    got = top_n_result(outputs, 2, "probabilities")
    assert list(got) == ["probabilities"] and got["probabilities"].dtype == np.float32
    np.testing.assert_allclose(got["probabilities"], [[2, 0.7], [1, 0.2]])
    with pytest.raises(ValueError, match="several outputs"):
        top_n_result(outputs, 2)


@pytest.mark.parametrize(
    ("cs", "message"),
    [
        ({"top_n": -1}, "cluster_serving.top_n: must be >= 0, got -1"),
        ({"top_n_output": "p"}, "cluster_serving.top_n_output: names the probabilities for top_n; set it"),
    ],
)
def test_settings_that_cannot_be_met_are_refused(cs: dict[str, object], message: str) -> None:
    raw = {"services": [{"name": "m", "processor": "python", "entry": "x.py:C", "public": True,
                         "cluster_serving": {"redis": "redis://127.0.0.1:6379/0", **cs}}]}  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(raw)
