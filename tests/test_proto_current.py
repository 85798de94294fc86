"""The committed generated code (eas_sdk/_proto, gateway/_proto) is exactly what
scripts/gen_proto.sh produces from proto/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODEGEN = ROOT / ".venv-codegen" / "bin" / "python"
# Each generated package, and what protoc writes into it.
PACKAGES = ("eas_sdk/_proto", "gateway/_proto")


def _generated(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*_pb2*.py*") if p.is_file())


@pytest.fixture(scope="module")
def fresh_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not CODEGEN.exists():
        pytest.fail("codegen environment missing: run scripts/setup.sh")
    out = tmp_path_factory.mktemp("proto")
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(out)], check=True, cwd=ROOT)
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_generated_protobuf_code_is_current(fresh_root: Path, package: str) -> None:
    fresh = _generated(fresh_root / package)
    assert fresh, "generator produced nothing"
    committed = _generated(ROOT / package)
    assert [p.name for p in fresh] == [p.name for p in committed]
    for new in fresh:
        old = ROOT / package / new.name
        assert new.read_bytes() == old.read_bytes(), f"{package}/{new.name} is stale: run gen_proto.sh"


@pytest.mark.parametrize("package", PACKAGES)
def test_sources_match_generated_set(package: str) -> None:
    protos = {p.stem for p in (ROOT / "proto" / package).glob("*.proto")}
    mods = {p.name.removesuffix("_pb2.py") for p in (ROOT / package).glob("*_pb2.py")}
    assert protos == mods


def test_generated_grpc_code_imports_inside_its_package() -> None:
    """protoc writes the import of a sibling module from the .proto's import path: the
    gateway's generated modules must import each other from gateway._proto, never as
    top-level modules (which would not be found, or would be someone else's)."""
    for path in _generated(ROOT / "gateway" / "_proto"):
        if path.suffix != ".py":
            continue
        for line in path.read_text().splitlines():
            if "_pb2" in line and line.startswith(("import ", "from ")):
                assert line.startswith("from gateway._proto import "), f"{path.name}: {line}"
