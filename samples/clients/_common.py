"""Shared bits of the sample clients: arguments and a few real digits to classify."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

# Names the sample model (samples/build_models.py) uses.
DIGITS_INPUT = "input"
DIGITS_LABEL = "label"
DIGITS_PROBABILITIES = "probabilities"


def parse_args(description: str, service: str = "digits") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--endpoint", default=os.environ.get("EAS_ENDPOINT", "http://127.0.0.1:8080"))
    p.add_argument("--service", default=service)
    p.add_argument("--token", default=os.environ.get("EAS_TOKEN", "secret-token"))
    return p.parse_args()


def need(*modules: str) -> None:
    """Exit naming the samples extra's tools that are missing (by their module names) and how
    to install them, instead of an ImportError's traceback: samples/build_models.py says it."""
    spec = importlib.util.spec_from_file_location(
        "_easkit_sample_models", Path(__file__).resolve().parents[1] / "build_models.py"
    )
    assert spec is not None and spec.loader is not None
    samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(samples)
    samples.exit_if_tools_missing(Path(sys.argv[0]).name, modules)


def digits(n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` images of scikit-learn's bundled digits set, scaled to [0, 1] as the model
    was trained (float32[n, 64]), and their labels."""
    need("sklearn")
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data[:n] / 16.0).astype(np.float32), data.target[:n].astype(np.int64)
