"""Bundled real utterances (CC BY 4.0; see README.md in this folder for the attribution)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources

__all__ = ["Utterance", "banking77", "hotels"]


@dataclass(frozen=True)
class Utterance:
    text: str
    label: str  # Banking77 intent, or the `;`-joined NLU++ intents (often empty)


def _read(path: str, label_column: str) -> list[Utterance]:
    text = resources.files(__name__).joinpath(path).read_text(encoding="utf-8")
    rows = csv.DictReader(io.StringIO(text, newline=""))
    return [Utterance(row["text"].strip(), row[label_column]) for row in rows]


def banking77(split: str = "train") -> list[Utterance]:
    """Banking77 customer queries; `split` is "train" (10,003) or "test" (3,080)."""
    if split not in {"train", "test"}:
        raise ValueError(f"unknown Banking77 split {split!r}: expected 'train' or 'test'")
    return _read(f"banking77/{split}.csv", "category")


def hotels() -> list[Utterance]:
    """997 NLU++ hotel-domain utterances."""
    return _read("hotels/utterances.csv", "intents")
