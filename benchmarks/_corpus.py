"""The bundled utterances, each distinct text embedded once with all-MiniLM-L6-v2 and kept
in `.bench/` (keyed by the texts and the model), for the drift benchmarks.

`embedder`: "fp32" (sentence-transformers, PyTorch), "int8" (the int8 ONNX Runtime export)
or "openvino" (the int8 OpenVINO export, NNCF static quantization), so a benchmark can be
run with each and the tables compared."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from infersight.monitor.data import banking77, hotels

OUT = Path(__file__).resolve().parents[1] / ".bench"


@dataclass(frozen=True, eq=False)
class Corpus:
    banking_texts: tuple[str, ...]  # distinct Banking77 texts, train and test
    banking: np.ndarray  # [N, 384] unit rows
    hotel_texts: tuple[str, ...]
    hotels: np.ndarray  # [H, 384]


EMBEDDERS = ("fp32", "int8", "openvino")


def load_corpus(embedder_kind: str = "fp32") -> Corpus:
    from infersight.monitor.drift import OnnxEmbedder, SentenceTransformerEmbedder
    from infersight.monitor.drift._openvino_embed import OpenVinoEmbedder

    if embedder_kind not in EMBEDDERS:
        raise ValueError(f"unknown embedder {embedder_kind!r}: valid ones are {', '.join(EMBEDDERS)}")
    b = tuple(sorted({u.text for u in banking77("train")} | {u.text for u in banking77("test")}))
    h = tuple(sorted({u.text for u in hotels()} - set(b)))
    kinds = {"fp32": SentenceTransformerEmbedder, "int8": OnnxEmbedder, "openvino": OpenVinoEmbedder}
    embedder = kinds[embedder_kind]()
    key = hashlib.sha256("\n".join([embedder.name, *b, "\x00", *h]).encode()).hexdigest()[:16]
    path = OUT / f"corpus_embeddings_{key}.npy"
    if path.exists():
        rows = np.load(path)
    else:
        rows = np.asarray(embedder.encode([*b, *h]), dtype=np.float32)
        OUT.mkdir(exist_ok=True)
        np.save(path, rows)
    return Corpus(b, rows[: len(b)], h, rows[len(b) :])


if __name__ == "__main__":
    c = load_corpus()
    print(len(c.banking_texts), len(c.hotel_texts), c.banking.shape)
