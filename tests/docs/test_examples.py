"""Every code example in ``README.md`` and ``docs/`` runs, against a real gateway.

Each page is one test; its examples run in order and share one Python namespace, as a
reader would type them. Sybil finds the examples; the rules:

* ``python`` blocks are executed. A block whose first line is ``# pip install <package>``
  for a client this project tests against (``eas-prediction``, ``tritonclient``) runs in a
  subprocess of that client's own virtual environment instead (see ``CLIENT_ENVS``).
* ``console`` blocks (and ``bash``/``shell``/``sh`` blocks with a ``$`` prompt) run each
  ``$ command`` with bash and compare what it prints with the lines shown under it
  (see ``tests/docs/output.py``).
* Other shell blocks are instructions to copy (install, start, run the suite), not run
  here; they must not call ``curl``: a request against the gateway is shown with a prompt
  and its answer.
* ``yaml`` blocks must parse; those with ``gateway`` or ``services`` keys are checked by the
  gateway's own config parser (files the snippet names need not exist here).
* ``<!-- skip: next -->`` before a block leaves it out (API outlines, not code to run).

The pages show the gateway's default address, ``127.0.0.1:8080``; each example is pointed
at the test gateway (samples/services.yaml on a free port) before it runs.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sybil import Document, Example
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from gateway.config import ConfigError, parse_config
from tests.docs.output import output_matches
from tests.e2e.gateway_proc import ROOT, GatewayProcess

DEFAULT_ADDRESSES = ("127.0.0.1:8080", "localhost:8080")
# Other clients' examples run in the environments scripts/setup.sh builds for them.
CLIENT_ENVS = {"eas-prediction": ".venv-eas", "tritonclient[http]": ".venv-clients"}
SHELLS = ("bash", "shell", "sh")
PAGES = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)])


def _address(example: Example) -> str:
    gw: GatewayProcess = example.namespace["__gateway__"]
    return gw.endpoint


def _point_at_gateway(text: str, example: Example) -> str:
    for default in DEFAULT_ADDRESSES:
        text = text.replace(default, _address(example))
    return text


def run_python(example: Example) -> None:
    source = _point_at_gateway(example.parsed, example)
    first = source.split("\n", 1)[0]
    if first.startswith("# pip install "):
        _run_in_client_env(first.removeprefix("# pip install ").strip(), source)
        return
    # Pad with blank lines so a traceback names the line of the page.
    code = compile("\n" * (example.line) + source, example.path, "exec")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, example.namespace)  # noqa: S102 - the documentation's own examples


def _run_in_client_env(package: str, source: str) -> None:
    assert package in CLIENT_ENVS, f"no test environment has {package!r}: {sorted(CLIENT_ENVS)}"
    python = ROOT / CLIENT_ENVS[package] / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout's SDK
    proc = subprocess.run(
        [str(python), "-c", source], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{package} example failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def _commands(block: str) -> list[tuple[str, str]]:
    """``[(command, expected output)]`` from a block of ``$ command`` lines and their output."""
    pairs: list[tuple[str, list[str]]] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") or not _complete(command):
                i += 1
                assert i < len(lines), f"unfinished command: {command!r}"
                command += "\n" + lines[i]
            pairs.append((command, []))
        else:
            assert pairs, f"output before any '$ ' command: {line!r}"
            pairs[-1][1].append(line)
        i += 1
    return [(cmd, "\n".join(out)) for cmd, out in pairs]


def _complete(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


def run_console(example: Example) -> None:
    commands = _commands(example.parsed)
    assert commands, "a console block needs at least one '$ ' command"
    env = {k: v for k, v in os.environ.items() if k not in ("http_proxy", "https_proxy", "HTTP_PROXY")}
    # As in a shell with the project's environment active: eas-gateway is on the PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for command, expected in commands:
        proc = subprocess.run(
            ["bash", "-c", _point_at_gateway(command, example)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        actual = proc.stdout.replace(_address(example), DEFAULT_ADDRESSES[0])
        assert proc.returncode == 0, f"$ {command}\nexited {proc.returncode}: {proc.stderr[-2000:]}"
        assert output_matches(expected, actual), f"$ {command}\nshown:\n{expected}\nprinted:\n{actual}"


def run_shell(example: Example) -> None:
    if any(line.startswith("$ ") for line in example.parsed.splitlines()):
        run_console(example)
        return
    assert "curl " not in example.parsed, "show a curl request with a '$ ' prompt and its answer"


def check_yaml(example: Example) -> None:
    data = yaml.safe_load(example.parsed)
    if not isinstance(data, dict) or not {"gateway", "services"} & data.keys():
        return
    try:
        parse_config(data, source=str(ROOT / "services.yaml"))
    except ConfigError as exc:
        # A snippet may name a model of the reader's or a token in the environment.
        if "file not found" not in str(exc) and "is not set" not in str(exc):
            raise


PARSERS: list[Any] = [
    CodeBlockParser("python", run_python),
    CodeBlockParser("console", run_console),
    *(CodeBlockParser(shell, run_shell) for shell in SHELLS),
    CodeBlockParser("yaml", check_yaml),
    SkipParser(),
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_on_the_page_runs(page: Path, docs_gateway: GatewayProcess) -> None:
    document = Document.parse(str(page), *PARSERS)
    document.namespace["__gateway__"] = docs_gateway
    for example in document.examples():
        try:
            example.evaluate()
        except Exception as exc:
            where = f"{page.relative_to(ROOT)}, line {example.line}"
            raise AssertionError(f"the example at {where} failed: {type(exc).__name__}: {exc}") from exc
    document.namespace.clear()
    gc.collect()  # a client the page left open warns here, on its own page
