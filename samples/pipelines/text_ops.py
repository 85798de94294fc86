"""The text sample pipeline's op: words to ids, as the model was trained (build_models.py).

The vocabulary is every word of the bundled reviews (reviews.tsv), sorted, numbered from 1;
0 stands for padding and for a word the model never saw.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from gateway.worker.ops import OpError

HERE = Path(__file__).resolve().parent
WORD_RE = re.compile(r"[a-z']+")


def reviews(path: Path = HERE / "reviews.tsv") -> list[tuple[str, str]]:
    """(label, text) pairs of the bundled data set."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            label, _, text = line.partition("\t")
            rows.append((label, text))
    return rows


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


def vocabulary() -> dict[str, int]:
    vocab = sorted({w for _, text in reviews() for w in words(text)})
    return {w: i + 1 for i, w in enumerate(vocab)}


class Tokenize:
    """``text`` (one string per row) -> ``ids`` int64[rows, max_words], zero-padded."""

    def initialize(self) -> None:
        self.vocab = vocabulary()
        self.max_words = int(self.config.get("max_words", 32))

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        texts = np.asarray(inputs["text"], dtype=object).reshape(-1)
        if texts.size == 0:
            raise OpError("text: expected at least one string")
        ids = np.zeros((texts.size, self.max_words), dtype=np.int64)
        for row, item in enumerate(texts):
            text = item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
            tokens = [self.vocab.get(w, 0) for w in words(text)][: self.max_words]
            ids[row, : len(tokens)] = tokens
        return {"ids": ids}
