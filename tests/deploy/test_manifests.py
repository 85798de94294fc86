"""The container image and the Kubernetes manifests in deploy/, checked offline.

Every manifest is validated against the Kubernetes API schemas (kubernetes-validate, strict:
unknown fields fail); the checks below hold what the schemas cannot: probes on the
gateway's health endpoints, non-root containers, the tokens' Secret feeding the services
file, and a Dockerfile whose command lines the gateway's own CLI accepts.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway import cli

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.31.0"
MANIFESTS = sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def parse_cli(args: list[str]) -> Any:
    """The gateway's own argument parser applied to a container's command line."""
    return cli._parser().parse_args(args)


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in docs(p)]


def find(kind: str, name: str) -> dict[str, Any]:
    for d in all_docs():
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind} {name} in deploy/kubernetes")


def containers(d: dict[str, Any]) -> list[dict[str, Any]]:
    return list(d["spec"]["template"]["spec"]["containers"])


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_is_valid_kubernetes(path: Path) -> None:
    for d in docs(path):
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == [p.name for p in MANIFESTS]


def test_workloads_run_as_non_root_with_limits_and_pinned_images() -> None:
    workloads = [d for d in all_docs() if d["kind"] in ("Deployment", "StatefulSet")]
    names = {d["metadata"]["name"] for d in workloads}
    assert names >= {"easkit-gateway", "easkit-worker-digits", "easkit-redis"}
    for d in workloads:
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, d["metadata"]["name"]
        for c in containers(d):
            assert re.search(r":\d+\.\d+\.\d+", c["image"]), f"{c['image']}: pin an exact version"
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            assert c["readinessProbe"] and c["livenessProbe"]


def test_gateway_probes_its_health_endpoints_on_its_port() -> None:
    (gw,) = containers(find("Deployment", "easkit-gateway"))
    args = gw["args"]
    port = int(args[args.index("--port") + 1])
    ports = {p["name"]: p["containerPort"] for p in gw["ports"]}
    assert ports["http"] == port
    assert gw["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert gw["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # The CLI the image runs accepts the manifest's command line as it is.
    assert gw["command"] == ["eas-gateway"]
    parsed = parse_cli(args)
    assert parsed.config == "/etc/easkit/services.yaml"


def test_services_file_tokens_come_from_the_secret() -> None:
    cm = find("ConfigMap", "easkit-services")
    secret = find("Secret", "easkit-tokens")
    services = cm["data"]["services.yaml"]
    wanted = set(re.findall(r"\$\{(\w+)\}", services))
    assert wanted, "tokens must not be written into the ConfigMap"
    assert wanted <= set(secret["stringData"])
    for name in ("easkit-gateway", "easkit-worker-digits"):
        (c,) = containers(find("Deployment", name))
        assert {"secretRef": {"name": "easkit-tokens"}} in c["envFrom"]
    # The gateway mounts the ConfigMap where its command line reads it.
    (gw,) = containers(find("Deployment", "easkit-gateway"))
    mounts = {m["name"]: m["mountPath"] for m in gw["volumeMounts"]}
    assert mounts["services"] == "/etc/easkit"
    assert yaml.safe_load(services)["gateway"]["port"] == 8080


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_pinned_non_root_with_a_health_check() -> None:
    steps = _dockerfile()
    bases = [rest for word, rest in steps if word == "FROM"]
    assert len(bases) >= 2
    for base in bases:
        assert re.match(r"[\w./-]+:\d+\.\d+\.\d+", base), f"{base}: pin the base image"
    users = [rest for word, rest in steps if word == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    (health,) = [rest for word, rest in steps if word == "HEALTHCHECK"]
    assert "/healthz" in health
    entry = yaml.safe_load([rest for word, rest in steps if word == "ENTRYPOINT"][-1])
    cmd = yaml.safe_load([rest for word, rest in steps if word == "CMD"][-1])
    assert entry == ["eas-gateway"]
    assert parse_cli(cmd).command == "serve"
    # The manifest runs the image's own default command line.
    (gw,) = containers(find("Deployment", "easkit-gateway"))
    assert gw["args"] == cmd, shlex.join(gw["args"])
