"""``python -m gateway serve --config services.yaml``."""

from __future__ import annotations

import sys

from gateway.cli import main

# Guarded: a helper process started with ``spawn`` imports this module again.
if __name__ == "__main__":
    sys.exit(main())
