"""Configuration traps: an open service must be declared, and YAML values that are not the
string that was meant are refused with a message saying how to quote them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import ConfigError, load_config, open_service_warnings, parse_config
from gateway.config.placement import thread_reason
from gateway.manage.spec import parse_spec, spec_of


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "services.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def _queue(**extra: object) -> dict[str, object]:
    return {"services": [{"name": "q", "processor": "queue", **extra}]}


@pytest.mark.parametrize(
    ("service", "fragment"),
    [
        ({}, "no token; give the service a token, or declare it open with 'public: true'"),
        ({"token": None}, "token: null; give the service a token"),
        ({"token": ""}, "token: empty"),
        ({"token": "t", "public": True}, "contradict"),
        ({"tokens": ["t"], "public": True}, "contradict"),
        ({"token": True}, "boolean"),
    ],
)
def test_tokens_missing_empty_null_and_public_are_distinguished(
    service: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigError, match="services\\[0\\] \\(q\\)") as info:
        parse_config(_queue(**service))
    assert fragment in str(info.value)


def test_open_services_are_declared() -> None:
    for service in ({"public": True}, {"public": True, "token": None}):
        (svc,) = parse_config(_queue(**service)).services
        assert svc.public and svc.tokens == ()
    (svc,) = parse_config(_queue(token="t", tokens=["u"])).services
    assert not svc.public and svc.tokens == ("t", "u")


@pytest.mark.parametrize(
    ("line", "fragment", "quoted"),
    [
        ("token: 0123456", "0-prefixed digits as octal", 'token: "0123456"'),
        ("token: 1234", "the number 1234", 'token: "1234"'),
        ("token: yes", "the boolean True", 'token: "yes"'),
        ("token: off", "the boolean False", 'token: "off"'),
        ("tokens: [no]", "tokens[0]: expected a string, got the boolean False", 'tokens: ["no"]'),
    ],
)
def test_yaml_surprises_say_how_to_quote(tmp_path: Path, line: str, fragment: str, quoted: str) -> None:
    head = "services:\n  - name: q\n    processor: queue\n    "
    with pytest.raises(ConfigError, match="quote the value") as info:
        _load(tmp_path, head + line + "\n")
    assert fragment in str(info.value)
    _load(tmp_path, head + quoted + "\n")  # quoted, it is the string that was meant


def test_gateway_strings_are_not_numbers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.log_level: expected a string, got the boolean"):
        _load(tmp_path, "gateway:\n  log_level: off\n")


@pytest.mark.parametrize(
    ("window", "message"),
    [(-1, "must be >= 0, got -1"), (10_001, r"from 0 \(off\) to 10000 microseconds; got 10001")],
)
def test_a_busy_poll_window_is_bounded(window: int, message: str) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.busy_poll_us: " + message):
        parse_config({**_queue(public=True), "gateway": {"busy_poll_us": window}})
    assert parse_config(_queue(public=True)).gateway.busy_poll_us == 0  # off unless asked
    assert parse_config({**_queue(public=True), "gateway": {"busy_poll_us": 300}}).gateway.busy_poll_us == 300


def test_public_service_on_a_non_loopback_address_warns() -> None:
    raw = {**_queue(public=True), "gateway": {"host": "0.0.0.0"}}
    (warning,) = open_service_warnings(parse_config(raw))
    assert "'q' is public" in warning and "0.0.0.0" in warning
    assert open_service_warnings(parse_config(_queue(public=True))) == []
    assert open_service_warnings(parse_config({**_queue(token="t"), "gateway": {"host": "0.0.0.0"}})) == []


# --- property tests: any document is a Config or a ConfigError naming what is wrong ---------

_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 1 << 40), st.floats(allow_nan=False), st.text(max_size=12),
    st.sampled_from(["queue", "python", "onnx", "q", "t0k3n", "${NOPE}", "0.0.0.0", "json"]),
)  # fmt: skip
_KEYS = st.sampled_from(
    ["name", "processor", "token", "tokens", "public", "workers", "queue", "max_length", "host", "port",
     "max_connections", "signature_max_skew_s", "async", "batching", "max_batch_size", "entry", "model"]
)  # fmt: skip
_DOC = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["gateway", "services"]), _DOC, max_size=2))
def test_any_document_is_a_config_or_a_config_error(doc: dict[str, object]) -> None:
    try:
        cfg = parse_config(doc)
    except ConfigError as exc:
        assert str(exc)
        return
    assert all(svc.tokens or svc.public for svc in cfg.services)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_any_yaml_text_is_a_config_or_a_config_error(tmp_path: Path, text: str) -> None:
    try:
        _load(tmp_path, text)
    except ConfigError:
        pass


def test_an_unset_variable_is_reported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    with pytest.raises(ConfigError) as info:
        parse_config({"services": [{"name": "a", "processor": "queue", "token": "${NOPE_TOKEN}"}]})
    assert "environment variable NOPE_TOKEN is not set" in str(info.value)
    assert "expected a mapping" not in str(info.value)  # no follow-on error for the same entry


DIGITS = str(Path(__file__).resolve().parents[2] / "samples" / "models" / "digits.onnx")


def test_placement_thread_is_for_onnx_services_only() -> None:
    onnx = {"name": "d", "processor": "onnx", "model": DIGITS, "public": True}
    (svc,) = parse_config({"services": [onnx]}).services
    assert (svc.placement, svc.placement_reason) == ("thread", thread_reason("onnx"))  # auto, the default
    (svc,) = parse_config({"services": [{**onnx, "placement": "thread", "workers": 2}]}).services
    assert (svc.placement, svc.workers) == ("thread", 2)
    with pytest.raises(ConfigError, match=r"services\[0\] \(d\)\.placement: .*process, thread"):
        parse_config({"services": [{**onnx, "placement": "inline"}]})
    echo = {"name": "e", "processor": "python", "entry": "x:Y", "public": True, "placement": "thread"}
    for service in (echo, {"name": "q", "processor": "queue", "public": True, "placement": "thread"}):
        with pytest.raises(
            ConfigError,
            match=r"\.placement: only a model service "
            r"\(onnx, sklearn, xgboost, lightgbm, torch, tensorflow, pmml\)",
        ) as info:
            parse_config({"services": [service]})
        assert f"({service['name']}).placement" in str(info.value)
    remote = {**onnx, "placement": "thread", "remote_workers": {"token": "r" * 16}}
    with pytest.raises(ConfigError, match=r"\(d\)\.placement: .* no remote workers"):
        parse_config({"services": [remote]})
    # Written back as it was given (the admin API's description and its store).
    (svc,) = parse_config({"services": [{**onnx, "placement": "thread"}]}).services
    assert spec_of(svc)["placement"] == "thread"
    assert parse_spec(spec_of(svc, redact=False)).placement == "thread"


def test_placement_auto_runs_onnx_in_threads_unless_it_asks_for_worker_processes() -> None:
    onnx = {"name": "d", "processor": "onnx", "model": DIGITS, "public": True}
    (svc,) = parse_config({"services": [onnx]}).services
    assert svc.placement == "thread"
    assert "onnx" in svc.placement_reason and "gateway's threads" in svc.placement_reason
    # Each thing only a worker process gives: worker processes, the reason naming it.
    asks = {
        "remote_workers": {"remote_workers": {"token": "r" * 16}},
        "autoscale": {"autoscale": {"min_workers": 1, "max_workers": 2}},
        "env": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}},
        "stall_timeout_s": {"stall_timeout_s": 5},
    }
    for key, extra in asks.items():
        (svc,) = parse_config({"services": [{**onnx, **extra}]}).services
        assert svc.placement == "process", key
        assert svc.placement_reason == f"auto: {key} needs worker processes"
    (svc,) = parse_config({"services": [{**onnx, "env": ["HOME"], "stall_timeout_s": 5}]}).services
    assert svc.placement_reason == "auto: env, stall_timeout_s needs worker processes"
    (svc,) = parse_config({"services": [{**onnx, "stall_timeout_s": 0}]}).services  # never restarted
    assert svc.placement == "thread"
    # Every other processor: worker processes, as before.
    echo = {"name": "e", "processor": "python", "entry": "x:Y", "public": True}
    (svc,) = parse_config({"services": [echo]}).services
    assert (svc.placement, svc.placement_reason) == (
        "process",
        "auto: a python service runs in worker processes",
    )
    # A placement the config names is kept, with no reason; autoscale on threads is refused.
    for placement in ("process", "thread"):
        (svc,) = parse_config({"services": [{**onnx, "placement": placement}]}).services
        assert (svc.placement, svc.placement_reason) == (placement, "")
    autoscaled = {**onnx, "placement": "thread", "autoscale": {"min_workers": 1, "max_workers": 2}}
    with pytest.raises(ConfigError, match=r"\(d\)\.autoscale: .*set placement: process"):
        parse_config({"services": [autoscaled]})


def test_placement_auto_runs_the_runtimes_that_release_the_gil_in_threads(tmp_path: Path) -> None:
    # The config reads only that the files are there: empty ones stand in for the models.
    files = {"xgboost": "m.json", "lightgbm": "m.txt", "sklearn": "m.joblib", "pmml": "m.pmml"}
    files["torch"] = "m.pt"
    for name in files.values():
        (tmp_path / name).touch()
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "saved_model.pb").touch()
    files["tensorflow"] = "saved"
    services = [{"name": p, "processor": p, "model": str(tmp_path / f), "public": True}
                for p, f in files.items()]  # fmt: skip
    top = {"model_dirs": [str(tmp_path)]}
    got = {svc.processor: (svc.placement, svc.placement_reason)
           for svc in parse_config({"gateway": top, "services": services}).services}  # fmt: skip
    reason = "auto: xgboost models run in the gateway's threads (XGBoost releases the GIL)"
    assert got["xgboost"] == ("thread", reason)
    assert got["lightgbm"] == ("thread", thread_reason("lightgbm")) and "LightGBM" in got["lightgbm"][1]
    # Those holding the GIL in their Python parts, or setting thread pools for the whole
    # process, stay on worker processes.
    for processor in ("sklearn", "pmml", "torch", "tensorflow"):
        assert got[processor] == ("process", f"auto: a {processor} service runs in worker processes")
    # Asking for what only worker processes give still moves them there.
    (svc,) = parse_config({"gateway": top, "services": [{**services[0], "stall_timeout_s": 5}]}).services
    moved = ("process", "auto: stall_timeout_s needs worker processes")
    assert (svc.placement, svc.placement_reason) == moved


def test_what_auto_chose_is_chosen_again_when_read_back() -> None:
    onnx = {"name": "d", "processor": "onnx", "model": DIGITS, "public": True}
    for extra in ({}, {"stall_timeout_s": 5}, {"placement": "auto"}):
        (svc,) = parse_config({"services": [{**onnx, **extra}]}).services
        assert "placement" not in spec_of(svc)
        again = parse_spec(spec_of(svc, redact=False))
        assert (again.placement, again.placement_reason) == (svc.placement, svc.placement_reason)
    (svc,) = parse_config({"services": [{**onnx, "placement": "process"}]}).services
    assert parse_spec(spec_of(svc, redact=False)).placement == "process"
