"""One real gateway for every documentation example: ``samples/services.yaml`` as a user
starts it, on a free port with a private data directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.gateway_proc import ROOT, GatewayProcess


@pytest.fixture(scope="session")
def docs_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = yaml.safe_load((ROOT / "samples" / "services.yaml").read_text())
    workdir: Path = tmp_path_factory.mktemp("docs-gateway")
    gw = GatewayProcess.start(config, workdir)
    try:
        for service in ("digits", "echo", "cs"):
            gw.wait_workers_ready(service, 1)
        yield gw
    finally:
        gw.stop()
