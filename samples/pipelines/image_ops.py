"""The image sample pipeline's op: an encoded image (PNG, JPEG, ...) to the 8x8 grey pixels
the digits models were trained on (scikit-learn's digits: 0 = white paper, 16 = full ink)."""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from gateway.worker.ops import OpError


def _image_bytes(item: Any) -> bytes:
    """Raw bytes, or base64 text (how JSON and Paddle's key/value callers send images)."""
    if isinstance(item, (bytes, bytearray)):
        raw = bytes(item)
        if raw[:8] == b"\x89PNG\r\n\x1a\n" or raw[:2] == b"\xff\xd8":
            return raw
        item = raw.decode("ascii", "replace")
    try:
        return base64.b64decode(str(item), validate=True)
    except (binascii.Error, ValueError):
        raise OpError("image: expected image bytes or base64 text") from None


class DecodeImage:
    """``image`` (one encoded image per row) -> ``pixels`` float32[rows, 64] in [0, 1]."""

    def initialize(self) -> None:
        self.size = int(self.config.get("size", 8))

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        images = np.asarray(inputs["image"], dtype=object).reshape(-1)
        rows = []
        for item in images:
            try:
                with Image.open(io.BytesIO(_image_bytes(item))) as img:
                    grey = ImageOps.grayscale(img).resize((self.size, self.size), Image.Resampling.BOX)
            except (UnidentifiedImageError, OSError, ValueError) as exc:
                raise OpError(f"image: cannot decode ({exc})") from None
            # Dark ink on light paper, as the digits were scanned: ink is 1.0, paper 0.0.
            rows.append(1.0 - np.asarray(grey, dtype=np.float32).reshape(-1) / 255.0)
        return {"pixels": np.stack(rows)}
