"""Every code example in ``README.md`` and ``docs/`` runs, against a real gateway.

Each page is one test; its examples run in order and share one Python namespace, as a
reader would type them. Sybil finds the examples; the rules:

* ``python`` blocks are executed. A block that imports another project's client
  (``eas_prediction``, ``tritonclient``, ``kserve``, ``bigdl``) runs in a subprocess of
  the virtual environment scripts/setup.sh builds for that client (see ``CLIENT_ENVS``).
  When a ``text`` block follows it at once, that is what the block must print (compared as
  below). Output is shown that way only: a ``print(...)  # output`` comment, which nothing
  would check, is refused.
* ``console`` blocks (and ``bash``/``shell``/``sh`` blocks with a ``$`` prompt) run each
  ``$ command`` with bash and compare what it prints with the lines shown under it
  (see ``tests/docs/output.py``).
* A ``bash`` block without prompts that calls ``curl`` runs as one script (in a scratch
  directory); when a ``json`` block follows it at once, that is the output it must print.
* Other shell blocks are instructions to copy (install, start, run the suite), not run.
* ``yaml`` blocks must parse; those with ``gateway`` or ``services`` keys are checked by the
  gateway's own config parser (files the snippet names need not exist here).
* ``<!-- skip: next -->`` (or ``<!-- skip: next "why" -->``) before a block leaves it out:
  API outlines, and examples that need what the test gateway has not (a Redis server).

The pages show the gateway's default addresses, ``127.0.0.1:8080`` (and ``127.0.0.1:8001``
for gRPC, Triton's port for it; 8081 is the admin API's, which no run example calls); each
example is pointed at the test gateway (samples/services.yaml on free ports) before it runs.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import os
import re
import shlex
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Any

import pytest
import yaml
from sybil import Document, Example
from sybil.parsers.markdown import CodeBlockParser, SkipParser

from gateway.config import ConfigError, parse_config
from tests.docs.conftest import DocsGateway
from tests.docs.output import output_matches
from tests.e2e.gateway_proc import ROOT

DEFAULT_HTTP = "127.0.0.1:8080"
# Other clients' examples run in the environments scripts/setup.sh builds for them, by the
# top-level module they import.
CLIENT_ENVS = {
    "eas_prediction": ".venv-eas",
    "tritonclient": ".venv-clients",
    "kserve": ".venv-clients",
    "bigdl": ".venv-bigdl",
}
SHELLS = ("bash", "shell", "sh")
PAGES = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)])


def _gateway(example: Example) -> DocsGateway:
    gw: DocsGateway = example.namespace["__gateway__"]
    return gw


def _point_at_gateway(text: str, example: Example) -> str:
    for shown, real in _gateway(example).addresses.items():
        text = text.replace(shown, real)
    return text


def _client_env(source: str) -> str | None:
    """The environment of the other project's client the example imports, if any."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None  # run here, where the error is reported with the page's line
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            env = CLIENT_ENVS.get(name.split(".")[0])
            if env is not None:
                return env
    return None


# A ``print(...)`` with a comment after it: output shown where nothing compares it.
_COMMENTED_PRINT = re.compile(r"^\s*print\(.*\)\s*#", re.M)
# A ``text`` block right after a ``python`` block: the output the block prints.
_SHOWN_TEXT = re.compile(r"\s*```text\n(.*?)```", re.S)


def run_python(example: Example) -> None:
    commented = _COMMENTED_PRINT.search(example.parsed)
    assert commented is None, (
        f"{commented.group(0).strip()!r}: show what the example prints in a ```text block right after it"
    )
    source = _point_at_gateway(example.parsed, example)
    env = _client_env(source)
    if env is not None:
        printed = _run_in_client_env(env, source)
    else:
        # Pad with blank lines so a traceback names the line of the page.
        code = compile("\n" * (example.line) + source, example.path, "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, example.namespace)  # noqa: S102 - the documentation's own examples
        printed = out.getvalue()
    shown = _SHOWN_TEXT.match(example.document.text, example.end)
    if shown is not None:
        actual = printed.replace(_gateway(example).process.endpoint, DEFAULT_HTTP)
        assert output_matches(shown.group(1), actual), f"shown:\n{shown.group(1)}\nprinted:\n{actual}"


def _run_in_client_env(venv: str, source: str) -> str:
    python = ROOT / venv / "bin" / "python"
    assert python.exists(), f"{venv} is missing: scripts/setup.sh builds it"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout's SDK
    proc = subprocess.run(
        [str(python), "-c", source], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    tail = f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"the example failed in {venv}:\n{tail}"
    return proc.stdout


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


# A ``json`` block right after a shell block: the output the command prints.
_SHOWN_OUTPUT = re.compile(r"\s*```json\n(.*?)```", re.S)


def _shell_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("http_proxy", "https_proxy", "HTTP_PROXY")}
    # As in a shell with the project's environment active: eas-gateway is on the PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_console(example: Example) -> None:
    commands = _commands(example.parsed)
    assert commands, "a console block needs at least one '$ ' command"
    env = _shell_env()
    for command, expected in commands:
        proc = subprocess.run(
            ["bash", "-c", _point_at_gateway(command, example)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        actual = proc.stdout.replace(_gateway(example).process.endpoint, DEFAULT_HTTP)
        assert proc.returncode == 0, f"$ {command}\nexited {proc.returncode}: {proc.stderr[-2000:]}"
        assert output_matches(expected, actual), f"$ {command}\nshown:\n{expected}\nprinted:\n{actual}"


def run_shell(example: Example) -> None:
    if any(line.startswith("$ ") for line in example.parsed.splitlines()):
        run_console(example)
        return
    if "curl " not in example.parsed:
        return  # an instruction (install, start the gateway, run the suite), not run here
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _point_at_gateway(example.parsed, example)],
        cwd=example.namespace["__scratch__"], env=_shell_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}: {proc.stderr[-2000:]}"
    shown = _SHOWN_OUTPUT.match(example.document.text, example.end)
    if shown is not None:
        actual = proc.stdout.replace(_gateway(example).process.endpoint, DEFAULT_HTTP)
        assert output_matches(shown.group(1), actual), f"shown:\n{shown.group(1)}\nprinted:\n{actual}"


def check_yaml(example: Example) -> None:
    data = yaml.safe_load(example.parsed)
    if not isinstance(data, dict) or not {"gateway", "services"} & data.keys():
        return
    try:
        parse_config(data, source=str(ROOT / "services.yaml"))
    except ConfigError as exc:
        # A snippet may name a model of the reader's or a token in the environment; every
        # other error (the parser lists them all) is the page's.
        messages = getattr(exc, "errors", None) or [str(exc)]
        wrong = [m for m in messages if "file not found" not in m and "is not set" not in m]
        if wrong:
            raise ConfigError("\n".join(wrong)) from None


PARSERS: list[Any] = [
    CodeBlockParser("python", run_python),
    CodeBlockParser("console", run_console),
    *(CodeBlockParser(shell, run_shell) for shell in SHELLS),
    CodeBlockParser("yaml", check_yaml),
    SkipParser(),
]


def _empty_queue(gw: DocsGateway, name: str = "jobs") -> None:
    """Empty a queue the pages share: each page's examples see it as a reader's fresh
    gateway has it, not with the records of the pages that ran before."""
    from eas_sdk import QueueClient

    with QueueClient(gw.process.endpoint, name) as queue:
        queue.set_token("secret-token")
        queue.init()
        last = int(queue.attributes()["stream.lastEntry"])
        if last:
            queue.truncate(last + 1)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_on_the_page_runs(page: Path, docs_gateway: DocsGateway, tmp_path: Path) -> None:
    _empty_queue(docs_gateway)
    document = Document.parse(str(page), *PARSERS)
    document.namespace["__gateway__"] = docs_gateway
    document.namespace["__scratch__"] = tmp_path
    for example in document.examples():
        try:
            example.evaluate()
        except unittest.SkipTest:
            continue  # skipped by the page, with its reason
        except Exception as exc:
            where = f"{page.relative_to(ROOT)}, line {example.line}"
            raise AssertionError(f"the example at {where} failed: {type(exc).__name__}: {exc}") from exc
    document.namespace.clear()
    gc.collect()  # a client the page left open warns here, on its own page
