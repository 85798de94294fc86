"""The model repository's layout read for every runtime the gateway serves: which file of a
folder is the model and which processor serves it (the rule ``serve --model`` uses), and
the folders it cannot tell refused naming the file and the suffixes it knows."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.cli.quick import quick_config
from gateway.config import ConfigError
from gateway.config.values import runtime_of
from gateway.manage.repository import _locate_keys, pick, scan


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def _served(services: list[dict]) -> dict[str, tuple[str, str]]:
    """name -> (processor, the model's path below the repository)."""
    out = {}
    for s in services:
        model = s.get("model") or next(iter(s["versions"].values()))
        out[s["name"]] = (s["processor"], model)
    return out


def test_every_runtime_is_found_by_its_file(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _touch(
        root,
        "onnx/1/model.onnx",
        "forest/2/model.joblib",
        "forest/1/model.onnx",  # an older version: the highest one serves
        "pickled/model.pkl",
        "boosted/1/model.json",
        "boosted/config.pbtxt",
        "binary/1/model.ubj",
        "light/3/model.txt",
        "light/3/labels.txt",
        "net/1/model.pt",
        "card/1/model.pmml",
        "mnist/1/model.savedmodel/saved_model.pb",
        "serving/4/saved_model.pb",  # TensorFlow Serving's layout: the version folder is the model
        "serving/4/variables/variables.index",
        "loose.joblib",
        "README.md",
        "labels.txt",  # not a model at the top level
        "settings.json",
    )
    got = _served(scan(root))
    r = str(root.resolve())
    assert got == {
        "onnx": ("onnx", f"{r}/onnx/1/model.onnx"),
        "forest": ("sklearn", f"{r}/forest/2/model.joblib"),
        "pickled": ("sklearn", f"{r}/pickled/model.pkl"),
        "boosted": ("xgboost", f"{r}/boosted/1/model.json"),
        "binary": ("xgboost", f"{r}/binary/1/model.ubj"),
        "light": ("lightgbm", f"{r}/light/3/model.txt"),
        "net": ("torch", f"{r}/net/1/model.pt"),
        "card": ("pmml", f"{r}/card/1/model.pmml"),
        "mnist": ("tensorflow", f"{r}/mnist/1/model.savedmodel"),
        "serving": ("tensorflow", f"{r}/serving/4"),
        "loose": ("sklearn", f"{r}/loose.joblib"),
    }


def test_the_same_rule_as_serve_model(tmp_path: Path) -> None:
    _touch(tmp_path, "saved/saved_model.pb")
    assert runtime_of(str(tmp_path / "saved")) == "tensorflow"
    for name, kind in {"m.ubj": "xgboost", "m.pt": "torch", "m.PMML": "pmml", "m.bin": "onnx"}.items():
        assert runtime_of(name) == kind
    assert pick("x", ["model.pt"], {}) == ("model.pt", "torch")


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["1/model.bin"], "x/1/model.bin: not a model file the gateway can tell (it serves .onnx, .joblib"),
        (["1/model.onnx", "1/model.pt"], "x/1: more than one model (model.onnx, model.pt)"),
        (["1/config.pbtxt"], "x/1: holds no model file (model.<ext>; the gateway serves .onnx, "),
        (["a.onnx", "b.joblib"], "x: more than one model (a.onnx, b.joblib)"),
    ],
)
def test_a_folder_it_cannot_tell_is_refused(tmp_path: Path, files: list[str], message: str) -> None:
    root = tmp_path / "repo"
    _touch(root / "x", *files)
    with pytest.raises(ConfigError) as caught:
        scan(root)
    assert str(caught.value).startswith(message), caught.value
    assert "SavedModel folder" in str(caught.value) or "more than one" in str(caught.value)


def test_a_pickle_loads_from_the_repository_the_operator_named(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _touch(root, "forest/1/model.joblib")
    args = argparse.Namespace(model_repository=str(root), workers=None, token=None, model=[], name=None)
    cfg = quick_config(args)
    assert cfg.gateway.model_dirs == (str(root.resolve()),)
    assert cfg.services[0].processor == "sklearn"
    _touch(root, "odd/1/model.bin")
    with pytest.raises(ConfigError, match=rf"^--model-repository {root}: odd/1/model.bin: not a model file"):
        quick_config(args)


def test_a_bucket_repository_reads_the_folder_layout() -> None:
    e = ("etag", 1)
    assert _locate_keys("m", {"": e}, "m.onnx") == ("", "onnx", "1")
    assert _locate_keys("m", {"": e}, "m.pmml") == ("", "pmml", "1")
    assert _locate_keys("m", {"model.onnx": e, "other.onnx": e}) == ("model.onnx", "onnx", "1")
    assert _locate_keys("m", {"a.onnx": e, "config.pbtxt": e}) == ("a.onnx", "onnx", "1")
    assert _locate_keys("m", {"1/model.onnx": e, "3/x.ubj": e, "0/model.onnx": e}) == (
        "3/x.ubj",
        "xgboost",
        "3",
    )
    assert _locate_keys("m", {"2/model.txt": e, "2/labels.txt": e}) == ("2/model.txt", "lightgbm", "2")
    with pytest.raises(ConfigError, match="more than one model"):
        _locate_keys("m", {"a.onnx": e, "b.onnx": e})
    with pytest.raises(ConfigError, match="m/2: holds no model file"):
        _locate_keys("m", {"2/sub/model.onnx": e})
    with pytest.raises(
        ConfigError, match="a SavedModel folder is served from a repository folder on this host"
    ):
        _locate_keys("m", {"1/model.savedmodel/saved_model.pb": e})
