"""Models named by a URL, without a store: the config's checks, the URL as shown, the
secret file, OSS's endpoint form, the download cache's checks, a backend that waits for its
model (the end-to-end tests against real servers are in tests/e2e/test_model_sources_e2e.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.backends.sourced import SourcedBackend, cache_dir, fetches_model
from gateway.config import ConfigError, GatewayConfig, ServiceConfig, parse_config
from gateway.config.model_urls import ModelSource, redact_url, source_for
from gateway.core import errors
from gateway.core.calls import WorkerRequest
from gateway.sources import Progress
from gateway.sources.cache import ModelCache, file_sha256
from gateway.sources.stores import StoreError, file_name, read_credentials, s3_client_args
from tests.gateway.doubles import BackendDouble


def _parse(model: Any, **gateway: Any) -> Any:
    return parse_config(
        {"gateway": gateway, "services": [{"name": "m", "processor": "onnx", "public": True, "model": model}]}
    )


def test_a_model_url_is_kept_as_given_and_file_urls_are_paths(tmp_path: Path) -> None:
    assert _parse("s3://models/a/model.onnx").services[0].model == "s3://models/a/model.onnx"
    assert _parse("oss://bucket.oss-cn-hangzhou.aliyuncs.com/m.onnx").services[0].model.startswith("oss://")
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    assert _parse(f"file://{model}").services[0].model == str(model)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://key:S3CR3Tval@models/a.onnx", "credentials do not belong in the config"),
        ("https://user:pw0rd99@example.com/a.onnx", "credentials do not belong in the config"),
        ("s3://models/", "naming one object"),
        ("s3://Models/a.onnx", "valid bucket name"),
        ("gs://models/a.onnx", "expected one of s3://, oss://, https://, http://"),
        ("https://example.com/", "naming one file"),
        ("file://elsewhere/a.onnx", "a file on this host"),
    ],
)
def test_a_bad_model_url_is_refused_naming_why_and_never_echoing_a_secret(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        _parse(url)
    assert said in str(err.value)
    assert "S3CR3Tval" not in str(err.value) and "pw0rd99" not in str(err.value)


def test_model_sources_are_read_and_checked() -> None:
    cfg = _parse(
        "s3://models/a.onnx",
        model_sources=[{"prefix": "s3://models/", "endpoint": "http://127.0.0.1:9000", "timeout_s": 5}],
        model_cache_dir="/var/cache/models",
    )
    (src,) = cfg.gateway.model_sources
    assert (src.endpoint, src.timeout_s, src.addressing_style) == ("http://127.0.0.1:9000", 5.0, "auto")
    assert cache_dir(cfg.gateway) == "/var/cache/models"
    assert cache_dir(GatewayConfig(data_dir="/d")) == "/d/models"
    for bad, said in [
        ([{"prefix": "ftp://x/"}], "expected a URL prefix"),
        ([{"prefix": "s3://k:s@models/"}], "credentials do not belong"),
        ([{"prefix": "s3://models/", "secret": "x"}], "unknown key"),
        ([{"prefix": "s3://models/", "addressing_style": "sideways"}], "must be one of"),
        ({"prefix": "s3://models/"}, "expected a list"),
    ]:
        with pytest.raises(ConfigError) as err:
            _parse("s3://models/a.onnx", model_sources=bad)
        assert said in str(err.value)


def test_with_model_dirs_a_url_needs_a_configured_source(tmp_path: Path) -> None:
    sources = [{"prefix": "s3://models/"}]
    _parse("s3://models/a.onnx", model_dirs=[str(tmp_path)], model_sources=sources)
    with pytest.raises(ConfigError, match=r"must start with the prefix of one of gateway\.model_sources"):
        _parse("s3://other/a.onnx", model_dirs=[str(tmp_path)], model_sources=sources)


def test_the_longest_prefix_wins_and_urls_are_shown_without_credentials() -> None:
    a, b = ModelSource(prefix="s3://models/"), ModelSource(prefix="s3://models/team/")
    assert source_for("s3://models/team/x.onnx", (a, b)) is b
    assert source_for("s3://models/x.onnx", (a, b)) is a
    assert source_for("s3://other/x.onnx", (a, b)) is None
    assert redact_url("https://u:p@host:8443/m.onnx?X-Amz-Signature=abc") == "https://host:8443/m.onnx?..."


def test_secret_files_in_key_value_and_aws_profile_form(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("# models\naccess_key_id = AK1\nsecret_access_key: 'SK1'\n")
    assert read_credentials(str(plain)) == {"access_key_id": "AK1", "secret_access_key": "SK1"}
    aws = tmp_path / "aws"
    aws.write_text("[default]\naws_access_key_id=AK2\naws_secret_access_key=SK2\naws_session_token=T2\n")
    assert read_credentials(str(aws)) == {
        "access_key_id": "AK2",
        "secret_access_key": "SK2",
        "session_token": "T2",
    }
    broken = tmp_path / "broken"
    broken.write_text("SK3-without-a-key\n")
    with pytest.raises(StoreError) as err:
        read_credentials(str(broken))
    assert "SK3" not in str(err.value)
    with pytest.raises(StoreError, match=r"credentials file .*missing"):
        read_credentials(str(tmp_path / "missing"))


def test_oss_urls_go_to_the_s3_compatible_endpoint_with_virtual_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("botocore")
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "SK")
    bucket, kw = s3_client_args("oss", "bucket.oss-cn-hangzhou.aliyuncs.com", None)
    assert (bucket, kw["endpoint_url"], kw["region_name"]) == (
        "bucket",
        "https://s3.oss-cn-hangzhou.aliyuncs.com",
        "cn-hangzhou",
    )
    assert kw["config"].s3 == {"addressing_style": "virtual"}
    assert (kw["aws_access_key_id"], kw["aws_secret_access_key"]) == ("AK", "SK")
    src = ModelSource(prefix="oss://b/", endpoint="oss-cn-beijing-internal.aliyuncs.com")
    _, kw = s3_client_args("oss", "b", src)
    assert (kw["endpoint_url"], kw["region_name"]) == (
        "https://s3.oss-cn-beijing-internal.aliyuncs.com",
        "cn-beijing",
    )
    monkeypatch.delenv("OSS_ENDPOINT", raising=False)
    with pytest.raises(StoreError, match="no OSS endpoint"):
        s3_client_args("oss", "b", None)


def test_file_names_stay_in_their_folder() -> None:
    assert file_name("/a/b/model.onnx") == "model.onnx"
    assert file_name("/a/..%2F..%2Fetc%2Fpasswd") == "passwd"
    assert file_name("/a/") == "a"
    assert file_name("/") == "model"


def test_the_cache_trusts_a_file_only_while_its_checksum_matches(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    url = "s3://models/m.onnx"
    with cache.locked(url), cache.part_file(url) as (part, sink):
        sink.write(b"model bytes")
        sink.flush()
        entry = cache.store(url, url, "e:1", "m.onnx", part, file_sha256(part))
    assert not part.exists()
    assert cache.lookup(url, "e:1") == entry
    assert cache.lookup(url, "e:2") is None
    entry.path.write_bytes(b"model byteZ")  # same size, other bytes
    assert cache.lookup(url, "e:1") is None
    assert not entry.path.exists()  # the damaged entry is gone


def test_the_cache_keeps_the_newest_versions_of_a_url(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path)
    url = "s3://models/m.onnx"
    paths = []
    for version in ("e:1", "e:2", "e:3"):
        with cache.part_file(url) as (part, sink):
            sink.write(version.encode())
            sink.flush()
            paths.append(cache.store(url, url, version, "m.onnx", part, file_sha256(part)).path)
        cache.prune(url, paths[-1])
    assert [p.exists() for p in paths] == [False, True, True]


def test_progress_reads_as_a_reason() -> None:
    p = Progress("s3://models/m.onnx", phase="downloading", done=3 * 2**20, total=12 * 2**20)
    assert p.text() == "downloading model s3://models/m.onnx: 3.0 MiB of 12.0 MiB (25%)"


class _Inner(BackendDouble):
    def __init__(self, service: ServiceConfig) -> None:
        self.service = service
        self.started_with: str | None = None

    async def start(self) -> None:
        self.started_with = self.service.model


async def test_a_backend_whose_model_cannot_be_fetched_answers_503_with_the_reason(tmp_path: Path) -> None:
    svc = ServiceConfig(name="m", processor="onnx", model="https://127.0.0.1:9/m.onnx", public=True)
    assert fetches_model(svc)
    gw = GatewayConfig(
        model_cache_dir=str(tmp_path), model_sources=(ModelSource(prefix="https://", timeout_s=2),)
    )
    inner = _Inner(svc)
    backend = SourcedBackend(inner, svc, gw)
    await backend.start()
    assert not await backend.wait_ready(1.0)
    reason = backend.not_ready_reason() or ""
    assert reason.startswith("cannot fetch model https://127.0.0.1:9/m.onnx: "), reason
    with pytest.raises(errors.ServiceNotReady, match="cannot fetch model"):
        await backend.dispatch(WorkerRequest(b"", "", "", "r", {}), 1.0)
    assert inner.started_with is None  # never started without its model
    await backend.stop(0.0)
