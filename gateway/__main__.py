"""``python -m gateway serve --config services.yaml``, and the ``eas-gateway`` command."""

from __future__ import annotations

import importlib.util
import sys

from gateway import __version__

# What the gateway imports that only its ``gateway`` extra installs: module -> distribution.
GATEWAY_EXTRA = {
    "aiohttp": "aiohttp",
    "onnxruntime": "onnxruntime",
    "yaml": "PyYAML",
    "prometheus_client": "prometheus-client",
    "orjson": "orjson",
    "cramjam": "cramjam",
}


def missing_extra() -> list[str]:
    """The distributions of the ``gateway`` extra this interpreter cannot import."""
    return [dist for module, dist in GATEWAY_EXTRA.items() if importlib.util.find_spec(module) is None]


def run() -> int:
    """The command line, or, where only the SDK is installed, what to install instead of an
    ImportError's traceback."""
    missing = missing_extra()
    if missing:
        print(
            "eas-gateway: the gateway needs the package's gateway extra; "
            f"missing here: {', '.join(missing)}.\n"
            "Install it into this environment, with the wheel python -m build made:\n"
            f'  pip install "dist/easkit-{__version__}-py3-none-any.whl[gateway]"',
            file=sys.stderr,
        )
        return 2
    from gateway.cli import main

    return main()


# Guarded: a helper process started with ``spawn`` imports this module again.
if __name__ == "__main__":
    sys.exit(run())
