"""Which embedder the monitor uses (`default_embedder()`): the OpenVINO int8 embedder, and
the measured choice between it and ONNX Runtime's (monitor/drift/_fast_embed.py).

`OpenVinoEmbedder` runs all-MiniLM-L6-v2 as an OpenVINO model statically quantized to int8
by NNCF (weights and activations; `ModelType.TRANSFORMER`, which keeps the softmax, the
layer norms and the residual adds in floating point and applies SmoothQuant), calibrated
on Banking77 *train* utterances shipped in the package (`infersight.monitor.data`). Its
activation scales are fixed at export, so a text's embedding does not depend on its
batchmates. The export reads the same fp32 ONNX graph the ONNX Runtime export quantizes,
runs once per machine and is cached as that one is, keyed by the model, the OpenVINO
version and the CPU's instruction sets. NNCF (and torch, onnx) are needed only to export.

ONNX Runtime's own static quantization (`quantize_static`, QDQ, MatMul only, per-channel,
MinMax on the same texts) run by OpenVINO was measured instead of NNCF: cosine median 0.947
to fp32 and slower (docs/benchmarks/drift.md), hence NNCF.

`choose()` is what `default_embedder()` runs on a CPU where both runtimes are installed:
once per machine (and thread count), it times both int8 embedders on calibration batches
(process CPU seconds, alternated, the threads as configured), keeps the faster, and caches
the choice next to the exports (`choice.json`); later processes read it.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import threading
import time
from contextlib import nullcontext, redirect_stdout
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from ._fast_embed import (
    BACKEND_ENV,
    BACKENDS,
    ExportedEmbedder,
    OnnxEmbedder,
    _exportable,
    _file_lock,
    cache_key_dir,
    fp32_onnx,
    load_tokenizer,
    padded_batches,
)
from ._windows import CachedEmbedder, Embedder, SentenceTransformerEmbedder, default_model_path
from .errors import EmbedderUnavailable

__all__ = [
    "CALIBRATION_TEXTS",
    "OpenVinoEmbedder",
    "calibration_texts",
    "choose",
    "default_embedder",
    "openvino_missing",
]

log = logging.getLogger(__name__)

_RECIPE = "minilm-meanpool-int8-nncf-static-transformer-v1"  # bump when the export changes
_CHOICE = "choice-v3"  # bump when either runtime's settings change
CALIBRATION_TEXTS = 512  # Banking77 train utterances the static quantization is calibrated on
_TIMING_TEXTS = 256  # calibration texts each backend embeds per timed round
_TIMING_ROUNDS = 3


def calibration_texts(n: int = CALIBRATION_TEXTS) -> list[str]:
    """`n` distinct Banking77 train utterances, spread over the split (never the test split,
    which the benchmarks measure on)."""
    from infersight.monitor.data import banking77

    distinct = list(dict.fromkeys(u.text for u in banking77("train")))
    return distinct[:: max(1, len(distinct) // n)][:n]


def export_openvino_int8(model_path: Path, out: Path, *, fp32: Path | None = None) -> Path:
    """Quantize the fp32 ONNX export of `model_path` (`fp32`, or one made now) to int8 with
    NNCF, calibrated on `calibration_texts()`; writes the OpenVINO model `out` (.xml, and its
    .bin) atomically: the .xml appears last, by a rename. Needs openvino, nncf, and for the
    fp32 export torch, transformers, onnx."""
    import nncf
    import openvino as ov
    from nncf.common.logging import nncf_logger

    nncf_logger.setLevel(logging.WARNING)  # no progress lines
    tokenizer = load_tokenizer(model_path)
    calib = [(ids, mask) for _, ids, mask in padded_batches(tokenizer, calibration_texts(), 64, plan=False)]
    dataset = nncf.Dataset(calib, lambda b: {"input_ids": b[0], "attention_mask": b[1],
                                              "token_type_ids": np.zeros_like(b[0])})  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.xml")
    try:
        with fp32_onnx(model_path, out, fp32) as source:
            model = ov.Core().read_model(str(source))
            with redirect_stdout(sys.stderr):  # its progress bars: never into a command's output
                quantized = nncf.quantize(
                    model, dataset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib)
                )
        ov.save_model(quantized, str(tmp))
        os.replace(tmp.with_suffix(".bin"), out.with_suffix(".bin"))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".bin").unlink(missing_ok=True)
    return out


class OpenVinoEmbedder(ExportedEmbedder):
    """A Sentence-BERT model (transformer, mean pooling, normalize) as an OpenVINO model
    statically quantized to int8 by NNCF, exported on first use (or found in `cache_dir`).
    `threads`: OpenVINO's inference threads (one stream, latency hint, not pinned)."""

    backend = "openvino"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requests = threading.local()  # an infer request serves one thread at a time

    @property
    def export_path(self) -> Path:
        import openvino

        folder = cache_key_dir(self.cache_dir, self._reference.name, _RECIPE, openvino.__version__)
        return folder / "model.int8.xml"

    def export(self, model_path: Path, target: Path, fp32: Path | None = None) -> None:
        export_openvino_int8(model_path, target, fp32=fp32)

    def open(self, target: Path) -> Any:
        import openvino as ov

        core = ov.Core()
        # threads not pinned to cores: a sidecar's cores are shared with what it serves (and
        # pinned threads measured slower on a loaded machine, the same when idle)
        # f32 for what is not quantized: on a CPU with AMX or AVX512-BF16 (Xeon Sapphire Rapids
        # and later) OpenVINO's default is bf16, which took the int8 embeddings' 1st-percentile
        # cosine against fp32 from 0.99 to 0.87 on Banking77 (docs/benchmarks/drift.md)
        config = {"INFERENCE_NUM_THREADS": self.threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                  "ENABLE_CPU_PINNING": False, "INFERENCE_PRECISION_HINT": "f32"}  # fmt: skip
        return core.compile_model(core.read_model(str(target)), "CPU", config)

    def run(self, session: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = session.create_infer_request()
        request.infer({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        return np.array(request.get_output_tensor(0).data, dtype=np.float32)  # a copy: the buffer is reused


def openvino_missing(embedder: OpenVinoEmbedder) -> str | None:
    """Why `embedder` cannot run here, or None. Only openvino and tokenizers are needed once
    the export is cached; nncf, onnx, torch and transformers only to make it."""
    needed = ["openvino", "tokenizers"]
    if find_spec("openvino") is not None and not embedder.export_path.exists():
        needed += ["nncf", "onnx", "torch", "transformers"]
    for module in needed:
        if find_spec(module) is None:
            return f"{module} is not installed"
    return None


def _cpu_seconds(embedders: list[ExportedEmbedder], texts: list[str]) -> dict[str, float]:
    """Median process CPU seconds per embedder to embed `texts`, the embedders alternated and
    the one going first swapped every round, each warmed up first."""
    for e in embedders:
        e.encode(texts[:64])
    seconds: dict[str, list[float]] = {e.backend: [] for e in embedders}
    for r in range(_TIMING_ROUNDS):
        for e in embedders if r % 2 == 0 else embedders[::-1]:
            start = time.process_time()
            e.encode(texts)
            seconds[e.backend].append(time.process_time() - start)
    return {k: statistics.median(v) for k, v in seconds.items()}


def choose(
    model_path: str | Path | None = None,
    *,
    threads: int | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> ExportedEmbedder:
    """The faster of the two int8 embedders on this machine at these threads, measured once
    (both exported first) and cached; the returned embedder's `choice` holds the figures and
    whether they were measured by this call. If the OpenVINO export fails, ONNX Runtime's
    embedder (one log line; nothing cached, so a later process tries again)."""
    import onnxruntime
    import openvino

    kwargs: dict[str, Any] = {"threads": threads, "cache_dir": cache_dir, "progress": progress}
    candidates: list[ExportedEmbedder] = [
        OnnxEmbedder(model_path, **kwargs),
        OpenVinoEmbedder(model_path, **kwargs),
    ]
    by_backend = {e.backend: e for e in candidates}
    first = candidates[0]
    path = cache_key_dir(first.cache_dir, first._reference.name, _CHOICE, onnxruntime.__version__,
                         openvino.__version__, f"threads={first.threads}") / "choice.json"  # fmt: skip

    def cached() -> ExportedEmbedder | None:
        try:
            choice = json.loads(path.read_text())
            chosen = by_backend[choice["backend"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        chosen.choice = {**choice, "measured_now": False, "path": str(path)}
        return chosen

    chosen = cached()
    if chosen is not None:
        return chosen
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path.with_suffix(".lock")):
        chosen = cached()  # another process may have measured meanwhile
        if chosen is not None:
            return chosen
        missing = [e for e in candidates if not e.export_path.exists()]
        try:
            shared = fp32_onnx(first.model_path, path) if len(missing) > 1 else nullcontext(None)
            with shared as fp32:  # both exports quantize one fp32 export
                for e in missing:
                    e.ensure_export(fp32)
            for e in candidates:
                e.progress = False
            seconds = _cpu_seconds(candidates, calibration_texts(_TIMING_TEXTS))
        except Exception as exc:
            log.warning("embedding with ONNX Runtime: the OpenVINO backend failed (%s: %s)",
                        type(exc).__name__, exc)  # fmt: skip
            first.progress = progress
            return first
        for e in candidates:
            e.progress = progress
        backend = min(seconds, key=lambda k: seconds[k])
        choice = {"backend": backend, "cpu_seconds": seconds, "texts": _TIMING_TEXTS,
                  "threads": first.threads, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(choice, indent=1))
        os.replace(tmp, path)
        log.info("embedding with %s: %.2f s of CPU against %s for %d texts at %d threads", backend,
                 seconds[backend], ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items() if k != backend),
                 _TIMING_TEXTS, first.threads)  # fmt: skip
        chosen = by_backend[backend]
        chosen.choice = {**choice, "measured_now": True, "path": str(path)}
        return chosen


def _cuda() -> bool:
    if find_spec("torch") is None or not Path("/proc/driver/nvidia").exists():
        return False  # no need to import torch to learn there is no GPU
    import torch

    return bool(torch.cuda.is_available())


def _fast_runtime_missing() -> str | None:
    """Why the int8 path cannot run here, or None. Nothing is imported: torch and
    transformers are needed only by the export, which a cached machine never runs."""
    for module in ("onnxruntime", "onnx", "torch", "transformers", "tokenizers"):
        if find_spec(module) is None:
            return f"{module} is not installed"
    return None


def default_embedder(
    model_path: str | Path | None = None,
    *,
    backend: str = "auto",
    device: str | None = None,
    threads: int | None = None,
    cache_dir: str | Path | None = None,
    cache_entries: int = 200_000,
    progress: bool = False,
) -> Embedder:
    """The embedder the CLI, the detector and the service use, behind a text-hash LRU cache
    of `cache_entries` texts (0: none).

    `backend="auto"` (or `$INFERSIGHT_EMBED_BACKEND` when the argument is "auto"): on CUDA
    (`device=None` looks for one) the Sentence-BERT model in fp16; on a CPU an int8 model:
    with the `drift-fast` extra, ONNX Runtime's, and with the `drift-openvino` extra too,
    whichever of ONNX Runtime's and OpenVINO's was faster when measured on this machine
    (`_openvino_embed.choose`, once, cached); without onnxruntime/onnx or for a model the
    export does not cover, the fp32 Sentence-BERT model (one log line says so).
    `"onnxruntime"`, `"openvino"` or `"sentence-transformers"` forces one. Its `backend` and
    `precision` attributes say which runs."""
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "").strip() or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"unknown embedder backend {backend!r}: valid backends are {', '.join(BACKENDS)}")
    inner: Embedder
    where = device or ("cuda" if backend not in ("onnxruntime", "openvino") and _cuda() else "cpu")
    if backend == "sentence-transformers" or (backend == "auto" and where != "cpu"):
        half = where != "cpu"
        inner = SentenceTransformerEmbedder(
            model_path, device=where, precision="fp16" if half else "fp32", progress=progress
        )
        return CachedEmbedder(inner, max_entries=cache_entries) if cache_entries > 0 else inner
    path = Path(model_path) if model_path is not None else default_model_path()
    kwargs: dict[str, Any] = {"threads": threads, "cache_dir": cache_dir, "progress": progress}
    if not _exportable(path):
        missing: str | None = f"{path} is not a transformer + mean pooling + normalize model"
        no_openvino: str | None = missing
    else:
        missing = _fast_runtime_missing()
        no_openvino = openvino_missing(OpenVinoEmbedder(model_path, **kwargs))
    if backend == "openvino":
        if no_openvino is not None:
            raise EmbedderUnavailable(str(path), f"the openvino backend cannot run: {no_openvino}")
        inner = OpenVinoEmbedder(model_path, **kwargs)
    elif missing is not None and backend == "onnxruntime":
        raise EmbedderUnavailable(str(path), f"the onnxruntime backend cannot run: {missing}")
    elif missing is not None:
        log.warning("embedding with the fp32 sentence-transformers model: %s "
                    "(the drift-fast extra gives the int8 ONNX Runtime one)", missing)  # fmt: skip
        inner = SentenceTransformerEmbedder(model_path, progress=progress)
    elif backend == "auto" and no_openvino is None:
        inner = choose(model_path, **kwargs)
    else:
        inner = OnnxEmbedder(model_path, **kwargs)
    return CachedEmbedder(inner, max_entries=cache_entries) if cache_entries > 0 else inner
