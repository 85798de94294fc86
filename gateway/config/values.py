"""Checking config values: typed readers that name the field in their errors, and the
collector that lets one pass over a file report every error at once."""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from gateway.config.catalog import FOLDER_MODELS, MODEL_PROCESSORS, PICKLE_PROCESSORS, runtime_for
from gateway.config.files import ConfigError, check_file, resolve_path
from gateway.config.located import line_of, relocated
from gateway.config.model_urls import check_model_url, file_url_path, is_file_url, is_model_url
from gateway.config.user_code import ENTRY_FORMS

# signature_max_skew_s: accept the Date of a client in any time zone (gateway.core.auth).
ANY_ZONE = "any_zone"


def max_skew_setting(value: object) -> float | str:
    """A ``signature_max_skew_s`` value: ``any_zone`` or seconds either way (0: no check).
    Raises ValueError saying what is accepted."""
    if value == ANY_ZONE:
        return ANY_ZONE
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            seconds = float(value)  # a string too: a ${VARIABLE} expands to one
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    raise ValueError(f"expected {ANY_ZONE!r} or a number of seconds >= 0 (900: 15 minutes), got {value!r}")


_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigErrors(ConfigError):
    """Every error found in one config file or service description, one per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class Errors:
    """Collects errors so that one pass reports all of them, each with its place."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, fn: Any, *args: Any, default: Any = None, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigErrors as exc:
            self.items.extend(exc.errors)
        except ConfigError as exc:
            self.items.append(str(exc))
        return default

    def add(self, message: str) -> None:
        self.items.append(message)

    def raise_any(self) -> None:
        if len(self.items) == 1:
            raise ConfigError(self.items[0])
        if self.items:
            raise ConfigErrors(self.items)


def expand(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            return os.environ[name]

        return _ENV_RE.sub(repl, value)
    if isinstance(value, list):
        return [expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return relocated(value, {k: expand(v, f"{where}.{k}") for k, v in value.items()})
    return value


def as_int(v: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
            v = int(v)
        else:
            raise ConfigError(f"{where}: expected an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ConfigError(f"{where}: must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ConfigError(f"{where}: must be <= {hi}, got {v}")
    return v


def as_float(v: Any, where: str, lo: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ConfigError(f"{where}: expected a number, got {v!r}")
    try:
        out = float(v)
    except ValueError:
        raise ConfigError(f"{where}: expected a number, got {v!r}") from None
    if lo is not None and out < lo:
        raise ConfigError(f"{where}: must be >= {lo}, got {out}")
    return out


def as_max_skew(v: Any, where: str) -> float | str:
    """A ``signature_max_skew_s``: ``any_zone`` (every time zone's offset) or seconds either way."""
    try:
        return max_skew_setting(v)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def as_bool(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    raise ConfigError(f"{where}: expected true or false, got {v!r}")


def yaml_hint(v: Any, where: str) -> str:
    """The message for a value YAML read as something other than the string that was meant."""
    if isinstance(v, bool):
        return (
            f"{where}: expected a string, got the boolean {v!r}: YAML reads unquoted yes/no/on/off/"
            f'true/false as booleans; quote the value, e.g. {where.rsplit(".", 1)[-1]}: "yes"'
        )
    return (
        f"{where}: expected a string, got the number {v!r}: YAML reads unquoted digits as a number "
        f'(and 0-prefixed digits as octal); quote the value, e.g. {where.rsplit(".", 1)[-1]}: "0123456"'
    )


def as_str(v: Any, where: str) -> str:
    if isinstance(v, (bool, int, float)):
        raise ConfigError(yaml_hint(v, where))
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) else repr(key)


def _close(key: Any, allowed: set[str]) -> str | None:
    if not isinstance(key, str):
        return None
    found = difflib.get_close_matches(key, sorted(allowed), n=1)
    return found[0] if found else None


def check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """One error per unknown key, with its line in the file where it was read from one, and
    the allowed key it is closest to (or the allowed keys when none is close)."""
    errs = Errors()
    for key in sorted(set(raw) - allowed, key=_key_text):  # YAML keys may be null or numbers
        line = line_of(raw, key)
        at = f" (line {line})" if line is not None else ""
        close = _close(key, allowed)
        hint = f"did you mean {close!r}?" if close else f"allowed: {', '.join(sorted(allowed))}"
        errs.add(f"{where}: unknown key {_key_text(key)!r}{at}; {hint}")
    errs.raise_any()


def respelt(raw: Mapping[str, Any], allowed: set[str]) -> Mapping[str, Any]:
    """``raw`` with each unknown key that is close to an allowed one (and not given as well)
    read as that key: its misspelling is then the only error it causes (check_keys reports
    it), not also a missing or wrong value under the key that was meant."""
    renames = {}
    for key in set(raw) - allowed:
        close = _close(key, allowed)
        if close is not None and close not in raw and close not in renames.values():
            renames[key] = close
    if not renames:
        return raw
    return relocated(raw, {renames.get(k, k): v for k, v in raw.items()})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROVIDER_RE = re.compile(r"^[A-Za-z]+ExecutionProvider$")


def as_strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of strings")
    return tuple(as_str(str(v), f"{where}[{i}]") for i, v in enumerate(value))


def as_choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping")
    return value


def as_env(value: Any, where: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """``env:`` as (values to set, names passed through from the gateway's environment):
    a mapping (a null value passes the name through) or a list of names."""
    if value is None:
        return {}, ()
    pairs = [(n, None) for n in value] if isinstance(value, list) else list(as_mapping(value, where).items())
    errs = Errors()
    values: dict[str, str] = {}
    names: list[str] = []
    for name, v in pairs:
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            errs.add(f"{where}: {name!r} is not an environment variable name")
        elif v is None:
            names.append(name)
        else:
            values[name] = str(v)
    errs.raise_any()
    return values, tuple(names)


def as_providers(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a list such as [CUDAExecutionProvider, CPUExecutionProvider]")
    bad = [p for p in value if not isinstance(p, str) or not _PROVIDER_RE.match(p)]
    if bad:
        raise ConfigError(f"{where}: {bad[0]!r} is not an ONNX Runtime execution provider name")
    return tuple(value)


def as_tokens(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of strings")
    errs = Errors()
    out = tuple(errs.check(as_str, str(t), f"{where}[{j}]", default="") for j, t in enumerate(value))
    errs.raise_any()
    return out


QUEUE_BACKEND_SCHEMES = ("redis://", "rediss://", "unix://")


def runtime_of(model: str) -> str:
    """The processor that serves ``model`` when none is named (``serve --model``, a pipeline
    step's own model): by the rule the model repository uses too (a SavedModel folder:
    tensorflow); a file or URL whose suffix names no runtime is tried as ONNX."""
    path = Path(model)
    inside = {p.name for p in path.iterdir()} if not is_model_url(model) and path.is_dir() else None
    return runtime_for(model, inside) or "onnx"


def check_model(path: str, processor: str, where: str) -> None:
    """A model service's model: a file, or for a runtime whose model is a folder (a
    TensorFlow SavedModel) that folder, holding the file that marks one."""
    if processor not in FOLDER_MODELS:
        check_file(path, where)
        return
    marker = FOLDER_MODELS[processor]
    if not (Path(path) / marker).is_file():
        what = "folder not found" if not Path(path).exists() else f"not a folder holding {marker}"
        raise ConfigError(f"{where}: {what}: {path}")


def as_versions(
    raw: Any, kind: str, model: Any, base: Path | None, where: str
) -> tuple[tuple[str, str], ...]:
    """``versions: {1: a.onnx, 2: b.onnx}``: positive integer versions, each a model file (for
    ``python``, the ``model`` each version's processor is given, checked by none)."""
    if raw is None:
        return ()
    w = f"{where}.versions"
    if kind not in MODEL_PROCESSORS and kind != "python":
        kinds = ", ".join((*MODEL_PROCESSORS, "python"))
        raise ConfigError(f"{w}: only a model service or user code ({kinds}) has model versions")
    if model is not None:
        raise ConfigError(f"{w}: give either model or versions, not both")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{w}: expected a mapping of version numbers to model files")
    out: dict[int, str] = {}
    for key, path in raw.items():
        number = as_int(key, f"{w} key {key!r}", lo=1, hi=2**31 - 1)
        if number in out:
            raise ConfigError(f"{w}: version {number} given twice")
        value = as_str(path, f"{w}.{key}")
        if is_model_url(value):  # fetched when the service starts (gateway.sources)
            out[number] = check_model_url(value, f"{w}.{key}")
            continue
        if is_file_url(value):
            value = file_url_path(value, f"{w}.{key}")
        resolved = resolve_path(value, base, f"{w}.{key}")
        if kind != "python":
            check_model(resolved, kind, f"{w}.{key}")
        out[number] = resolved
    return tuple((str(n), out[n]) for n in sorted(out))


def check_queue_backend(cfg: Any, where: str) -> None:
    if cfg.backend != "sqlite" and not cfg.backend.startswith(QUEUE_BACKEND_SCHEMES):
        raise ConfigError(  # the value is not echoed: a URL may hold a password
            f"{where}.backend: expected 'sqlite' or a Redis URL ({', '.join(QUEUE_BACKEND_SCHEMES)})"
        )


def check_model_dirs(svc: Any, dirs: tuple[str, ...], where: str, prefixes: tuple[str, ...] = ()) -> None:
    """Refuse a model or entry file outside the configured model directories (links and
    ``..`` resolved first, so neither can lead out of them). A service whose model is a
    pickle (loading it runs code) needs model directories: it loads only from them. With
    model directories, a model URL must start with one of ``prefixes`` (the configured model
    sources'): the directories' counterpart for fetched models."""
    steps = svc.pipeline.steps if svc.pipeline is not None else ()
    if not dirs:
        # A pipeline's step may load a pickle of its own too.
        pickles = [("model", svc.processor)] if svc.processor in PICKLE_PROCESSORS else []
        pickles += [
            (f"pipeline.steps[{i}].model", step.processor)
            for i, step in enumerate(steps)
            if step.model is not None and step.processor in PICKLE_PROCESSORS
        ]
        if pickles:
            key, processor = pickles[0]
            raise ConfigError(
                f"{where}.{key}: a {processor} model is a pickle, and loading a pickle runs its code: "
                "list the folders such models may be loaded from in gateway.model_dirs"
            )
        return
    roots = [Path(d).resolve() for d in dirs]
    files = [("model", svc.model), *((f"versions.{v}", path) for v, path in svc.versions[:-1])]
    if svc.entry and svc.entry.rpartition(":")[0].endswith(".py"):
        files.append(("entry", svc.entry.rpartition(":")[0]))
    # A pipeline's steps load models and run ops of their own: held to the same folders.
    for i, step in enumerate(steps):
        files.append((f"pipeline.steps[{i}].model", step.model))
        if step.op and step.op.rpartition(":")[0].endswith(".py"):
            files.append((f"pipeline.steps[{i}].op", step.op.rpartition(":")[0]))
    errs = Errors()
    for key, path in files:
        if path is None:
            continue
        if is_model_url(path):
            if not any(path.startswith(p) for p in prefixes):
                errs.add(
                    f"{where}.{key}: with gateway.model_dirs set, a model URL must start with the "
                    "prefix of one of gateway.model_sources"
                )
            continue
        real = Path(path).resolve()
        if not any(real.is_relative_to(root) for root in roots):
            errs.add(
                f"{where}.{key}: {Path(path).name} is outside the model directories "
                f"(gateway.model_dirs: {', '.join(str(r) for r in roots)})"
            )
    errs.raise_any()


def coerce_dataclass(cls: type, raw: Any, where: str) -> Any:
    """Generic coercion for the flat numeric/bool/str dataclasses (queue, batching, gateway)."""
    out, errs = coerce_partial(cls, raw, where)
    errs.raise_any()
    return out


def coerce_partial(cls: type, raw: Any, where: str) -> tuple[Any, Errors]:
    """The dataclass built from the keys that are right, and the errors of the others."""
    errs = Errors()
    if raw is None:
        return cls(), errs
    if not isinstance(raw, dict):
        errs.add(f"{where}: expected a mapping, got {type(raw).__name__}")
        return cls(), errs
    names = {f.name for f in fields(cls)}
    errs.check(check_keys, raw, names, where)
    out: dict[str, Any] = {}
    defaults = cls()
    for key, value in raw.items():
        if key not in names:
            continue
        w = f"{where}.{key}"
        default = getattr(defaults, key)
        if isinstance(default, bool):
            out[key] = errs.check(as_bool, value, w, default=default)
        elif isinstance(default, int):
            out[key] = errs.check(as_int, value, w, lo=0, default=default)
        elif isinstance(default, float):
            out[key] = errs.check(as_float, value, w, lo=0.0, default=default)
        elif isinstance(default, tuple):
            out[key] = errs.check(as_strings, value, w, default=default)
        else:
            out[key] = None if value is None else errs.check(as_str, value, w, default=default)
    return cls(**out), errs


def model_path(raw: Mapping[str, Any], processor: str, base: Path | None, where: str) -> str | None:
    model = raw.get("model")
    if is_model_url(model):  # fetched when the service starts (gateway.sources)
        return check_model_url(model, f"{where}.model")
    if is_file_url(model):
        model = file_url_path(model, f"{where}.model")
    if processor in MODEL_PROCESSORS:
        model = resolve_path(as_str(model, f"{where}.model"), base, f"{where}.model")
        # Served only by remote workers: the file is on their hosts, not necessarily here.
        if not (raw.get("remote_workers") is not None and raw.get("workers") == 0):
            check_model(model, processor, f"{where}.model")
    elif model is not None:
        model = resolve_path(as_str(model, f"{where}.model"), base, f"{where}.model")
    return model


def entry_path(raw: Mapping[str, Any], processor: str, base: Path | None, where: str) -> str | None:
    entry = raw.get("entry")
    if processor != "python":
        return entry if entry is None else str(entry)
    entry = as_str(entry, f"{where}.entry")
    if ":" not in entry:
        raise ConfigError(f"{where}.entry: expected {ENTRY_FORMS}")
    target, _, cls_name = entry.rpartition(":")
    if target.endswith(".py"):
        target = resolve_path(target, base, f"{where}.entry")
        check_file(target, f"{where}.entry")
    return f"{target}:{cls_name}"


def tokens_of(raw: Mapping[str, Any], where: str) -> tuple[str | None, tuple[str, ...], bool]:
    """(token, extra tokens, public). An open service must say so: ``public: true`` with no
    token (missing or ``token: null``); an empty token, or no token without ``public: true``,
    is an error, so a typo or an unset variable never opens a service."""
    public = as_bool(raw.get("public", False), f"{where}.public")
    extra = raw.get("tokens") or []
    if not isinstance(extra, list):
        raise ConfigError(f"{where}.tokens: expected a list of strings")
    extra_tokens = tuple(as_str(t, f"{where}.tokens[{j}]") for j, t in enumerate(extra))
    token = raw.get("token")
    if token is not None:
        if token == "":
            raise ConfigError(
                f"{where}.token: empty; give the service a token, or declare it open with "
                "'public: true' (and no token)"
            )
        token = as_str(token, f"{where}.token")
    if public and (token is not None or extra_tokens):
        raise ConfigError(f"{where}: 'public: true' and a token contradict each other; keep one")
    if not public and token is None and not extra_tokens:
        said = "token: null" if "token" in raw else "no token"
        raise ConfigError(
            f"{where}: {said}; give the service a token, or declare it open with 'public: true'"
        )
    return token, extra_tokens, public


def open_service_warnings(cfg: Any) -> list[str]:
    """Warnings due at start: services anyone who reaches the listener can call."""
    host = cfg.gateway.host
    if host in ("localhost", "") or host.startswith("127.") or host == "::1":
        return []
    return [
        f"service {svc.name!r} is public (no token) and the gateway listens on {host}, "
        "which is not a loopback address: anyone who reaches it can call the service"
        for svc in cfg.services
        if not svc.tokens
    ]


__all__ = [
    "QUEUE_BACKEND_SCHEMES",
    "ConfigError",
    "ConfigErrors",
    "Errors",
    "as_bool",
    "as_choice",
    "as_env",
    "as_float",
    "as_int",
    "as_mapping",
    "as_providers",
    "as_str",
    "as_strings",
    "as_tokens",
    "as_versions",
    "check_file",
    "check_keys",
    "check_model",
    "check_model_dirs",
    "check_queue_backend",
    "coerce_dataclass",
    "coerce_partial",
    "entry_path",
    "expand",
    "is_loopback",
    "model_path",
    "open_service_warnings",
    "resolve_path",
    "respelt",
    "runtime_of",
    "tokens_of",
    "yaml_hint",
]  # fmt: skip
