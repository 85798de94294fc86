"""The committed eas_sdk/_proto modules are exactly what scripts/gen_proto.sh produces."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODEGEN = ROOT / ".venv-codegen" / "bin" / "python"


def test_generated_protobuf_code_is_current(tmp_path: Path) -> None:
    if not CODEGEN.exists():
        pytest.fail("codegen environment missing: run scripts/setup.sh")
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, cwd=ROOT)
    fresh = sorted((tmp_path / "eas_sdk" / "_proto").glob("*_pb2.py*"))
    assert fresh, "generator produced nothing"
    committed = sorted((ROOT / "eas_sdk" / "_proto").glob("*_pb2.py*"))
    assert [p.name for p in fresh] == [p.name for p in committed]
    for new in fresh:
        old = ROOT / "eas_sdk" / "_proto" / new.name
        assert new.read_bytes() == old.read_bytes(), f"{new.name} is stale: run scripts/gen_proto.sh"


def test_sources_match_generated_set() -> None:
    protos = {p.stem for p in (ROOT / "proto" / "eas_sdk" / "_proto").glob("*.proto")}
    mods = {p.name.removesuffix("_pb2.py") for p in (ROOT / "eas_sdk" / "_proto").glob("*_pb2.py")}
    assert protos == mods
