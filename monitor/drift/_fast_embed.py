"""The int8 ONNX Runtime embedder (`OnnxEmbedder`) and what the int8 exports share.

On a CPU `default_embedder()` (monitor/drift/_openvino_embed.py) runs all-MiniLM-L6-v2 exported to ONNX and dynamically quantized to int8
(`OnnxEmbedder`), run by ONNX Runtime with every graph optimization on, its threads set
to what this process may use, and its texts ordered by token count and cut into batches
(`plan_batches`: at most 64 texts, a power of two, widths from a few buckets) so padding
costs little and a runtime that compiles per shape meets the same shapes again. Mean pooling and normalization, as the Sentence-BERT model does them, are part of
the exported graph. It is several times faster than the fp32 PyTorch model at a cosine of
about 0.99 to its embeddings (docs/benchmarks/drift.md).

The export runs once per machine and is cached (`embedder_cache_dir()`), keyed by the
model's files, the ONNX Runtime version and the CPU's instruction sets, as the engine
caches its path choice: a new runtime or another CPU makes a new export. Two processes
that export at once take turns on a file lock; the file appears by an atomic rename.

With the `drift-openvino` extra too (openvino, nncf), an OpenVINO int8 model statically
quantized by NNCF (`OpenVinoEmbedder`, monitor/drift/_openvino_embed.py) is the other
candidate: the first time on a machine both are exported and timed, the faster is kept and
the choice cached with the exports.

On CUDA it is the Sentence-BERT model in fp16. Without the `drift-fast` extra (onnxruntime,
onnx) it is the fp32 Sentence-BERT model, said in one log line. The choice can be forced
with `backend=` (or `$INFERSIGHT_EMBED_BACKEND`, or the service's `drift.embedder`).

Embeddings of different backends differ slightly, so each backend has its own `name`
(stored with a reference's embeddings): a reference embedded by one is re-embedded, never
compared, by another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._windows import SentenceTransformerEmbedder, default_model_path
from .errors import EmbedderUnavailable

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "ExportedEmbedder",
    "OnnxEmbedder",
    "bucket_width",
    "cpu_isa",
    "default_threads",
    "embedder_cache_dir",
    "export_fp32_onnx",
    "export_int8",
    "plan_batches",
]

log = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("auto", "onnxruntime", "openvino", "sentence-transformers")
BACKEND_ENV = "INFERSIGHT_EMBED_BACKEND"  # forces default_embedder's backend="auto"
_RECIPE = "minilm-meanpool-int8-qoperator-perchannel-v1"  # bump when the export changes
# the instruction sets that decide which int8 kernels ONNX Runtime runs (docs/benchmarks/drift.md)
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "i8mm")


def cpu_isa() -> str:
    """The machine and the int8-relevant instruction sets of its CPU, e.g. `x86_64:avx2,avx512_vnni`."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
                break
    return f"{platform.machine()}:{','.join(f for f in _ISA_FLAGS if f in flags)}"


def default_threads() -> int:
    """The CPUs this process may run on (its affinity mask: what the sidecar was given)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def embedder_cache_dir() -> Path:
    """`$INFERSIGHT_CACHE_DIR/embedders`, else `$XDG_CACHE_HOME/infersight/embedders`, else
    `~/.cache/infersight/embedders`."""
    root = os.environ.get("INFERSIGHT_CACHE_DIR")
    if root:
        return Path(root) / "embedders"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "infersight" / "embedders"


def _exportable(path: Path) -> bool:
    """A Sentence-BERT directory whose pipeline the export reproduces: a transformer, mean
    pooling, normalization."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        types = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        pooling = next(m["path"] for m in modules if str(m.get("type", "")).endswith("Pooling"))
        mean = json.loads((path / pooling / "config.json").read_text()).get("pooling_mode_mean_tokens")
    except (OSError, ValueError, StopIteration, KeyError, TypeError):
        return False
    return types == ["Transformer", "Pooling", "Normalize"] and bool(mean)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no POSIX locks: two exports may race, the rename keeps the file whole
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quiet_quantizer(record: logging.LogRecord) -> bool:
    return "quantization" not in record.pathname or record.levelno >= logging.ERROR


def export_fp32_onnx(model_path: Path, out: Path) -> Path:
    """Export the Sentence-BERT model at `model_path` (transformer, mean pooling, normalize)
    to an fp32 ONNX graph at `out` (inputs input_ids, attention_mask, token_type_ids; output
    the unit embedding). Needs torch, transformers, onnx."""
    import warnings

    import onnx
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is ever fetched from a hub
    model = AutoModel.from_pretrained(str(model_path), local_files_only=True, attn_implementation="eager")
    model.eval()

    class Pooled(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            h = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state  # [B, T, D]
            w = attention_mask.unsqueeze(-1).to(h.dtype)  # [B, T, 1]
            mean = (h * w).sum(1) / w.sum(1).clamp(min=1e-9)  # [B, D]
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    out.parent.mkdir(parents=True, exist_ok=True)
    dims = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "token_type_ids": {0: "batch", 1: "tokens"}, "embedding": {0: "batch"}}  # fmt: skip
    example = torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent Python branches
        torch.onnx.export(
            Pooled(model), (example, example, torch.zeros_like(example)), str(out),
            input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["embedding"],
            dynamic_axes=dims, opset_version=17, dynamo=False,
        )  # fmt: skip
    onnx.checker.check_model(str(out))
    return out


@contextlib.contextmanager
def fp32_onnx(model_path: Path, near: Path, given: Path | None = None) -> Iterator[Path]:
    """`given` if not None, else a temporary fp32 export next to `near`, removed on exit."""
    if given is not None:
        yield given
        return
    tmp = near.with_name(f".{near.stem}.{os.getpid()}.{threading.get_ident()}.fp32.onnx")
    try:
        yield export_fp32_onnx(model_path, tmp)
    finally:
        tmp.unlink(missing_ok=True)


def export_int8(model_path: Path, out: Path, *, fp32: Path | None = None) -> Path:
    """Export the Sentence-BERT model at `model_path` to ONNX (`export_fp32_onnx`, or the
    fp32 export `fp32` if given) and quantize its weights to int8, per channel (QOperator:
    the faster format on the CPUs measured); writes `out` atomically. Needs torch,
    transformers, onnx, onnxruntime."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.int8.onnx")
    try:
        with fp32_onnx(model_path, out, fp32) as source:
            root = logging.getLogger()
            root.addFilter(_quiet_quantizer)  # it logs a line per tensor on the root logger
            try:
                quantize_dynamic(source, tmp, weight_type=QuantType.QInt8, per_channel=True)
            finally:
                root.removeFilter(_quiet_quantizer)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def cache_key_dir(cache_dir: Path, model_name: str, *parts: str) -> Path:
    """The folder of one export: the model's name and a digest of what decides the export
    (the recipe, the runtime's version, the CPU's instruction sets)."""
    digest = hashlib.sha256("\n".join([model_name, *parts, cpu_isa()]).encode()).hexdigest()[:16]
    return cache_dir / f"{model_name.split(':')[0]}-{digest}"


def load_tokenizer(model_path: Path) -> Any:
    """The model's fast tokenizer, truncating at its max_seq_length, padding nothing."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    config = json.loads((model_path / "sentence_bert_config.json").read_text())
    tokenizer.enable_truncation(int(config.get("max_seq_length", 256)))
    tokenizer.no_padding()  # each batch is padded to its own longest text
    return tokenizer


# What one call costs beyond its padded tokens, in tokens: a call's fixed cost over one
# token's, for this model at 1 thread on the CPUs measured (docs/benchmarks/drift.md).
_CALL_TOKENS = 32


def bucket_width(width: int, cap: int) -> int:
    """`width` rounded up to one of four widths per octave past 8 (10, 12, 14, 16, 20, 24, 28,
    32, 40, ...), at most `cap`: a runtime that compiles per input shape (OpenVINO's CPU
    plugin: a compile the first time a shape is seen) meets few distinct shapes."""
    if width <= 8:
        return width
    step = 1 << (width.bit_length() - 3)
    return max(width, min(cap, -(-width // step) * step))


def plan_batches(lengths: np.ndarray, batch_size: int, cap: int) -> list[tuple[np.ndarray, int]]:
    """(rows, width) per batch for texts of `lengths` tokens: the texts ordered by length and
    cut into batches of a power of two rows (or `batch_size`), at most `batch_size`, each
    padded to `bucket_width` of its longest; the cuts minimize the padded tokens plus a
    call's cost (`_CALL_TOKENS`) over the batches. Fixed batches of 64 waste most where
    lengths spread: the longest texts' batch pads short ones to the longest."""
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order]
    sizes = sorted({batch_size, *(1 << k for k in range(batch_size.bit_length()))})
    n = order.size
    cost = [0.0] * (n + 1)  # cost[j]: the cheapest plan of the j shortest texts
    rows = [0] * (n + 1)  # the size of its last batch
    for j in range(1, n + 1):
        width = bucket_width(int(ordered[j - 1]), cap)
        cost[j], rows[j] = min((cost[j - r] + r * width + _CALL_TOKENS, r) for r in sizes if r <= j)
    plan: list[tuple[np.ndarray, int]] = []
    j = n
    while j > 0:
        plan.append((order[j - rows[j] : j], bucket_width(int(ordered[j - 1]), cap)))
        j -= rows[j]
    return plan[::-1]


def padded_batches(
    tokenizer: Any, texts: Sequence[str], batch_size: int, *, plan: bool = True, progress: bool = False
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(rows, input_ids, attention_mask) per batch, the texts ordered by token count so
    similar lengths share a batch (little padding); 0 is [PAD]. `plan`: batches as
    `plan_batches` cuts them, else `batch_size` texts each padded to the longest (what
    the OpenVINO export is calibrated on)."""
    encodings = tokenizer.encode_batch(list(texts))
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    batches: Iterable[tuple[np.ndarray, int]]
    if plan:
        cap = int((tokenizer.truncation or {}).get("max_length", lengths.max(initial=1)))
        batches = plan_batches(lengths, batch_size, max(cap, int(lengths.max(initial=1))))
    else:
        order = np.argsort(lengths, kind="stable")
        cuts = (order[s : s + batch_size] for s in range(0, order.size, batch_size))
        batches = [(idx, int(lengths[idx].max())) for idx in cuts]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="Batches")
    for idx, width in batches:
        ids = np.zeros((idx.size, width), dtype=np.int64)  # [B, T]
        mask = np.zeros((idx.size, width), dtype=np.int64)
        for row, i in enumerate(idx):
            e = encodings[i]
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        yield idx, ids, mask


class ExportedEmbedder:
    """A Sentence-BERT model run by an inference runtime from an export made on first use
    (or found in `cache_dir`). `threads`: the runtime's threads (default: the CPUs this
    process may use). Subclasses say where the export lives, how it is made and run."""

    backend = "?"
    precision = "int8"
    # set by `_openvino_embed.choose`: what was measured when this one was chosen over the other
    choice: dict[str, Any] | None = None

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        threads: int | None = None,
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        progress: bool = False,
    ) -> None:
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        self._reference = SentenceTransformerEmbedder(model_path)
        self.threads = threads or default_threads()
        self.batch_size = batch_size
        self.progress = progress  # a tqdm bar of batches on stderr, as sentence-transformers draws
        self.cache_dir = Path(cache_dir) if cache_dir is not None else embedder_cache_dir()
        self.exported = False  # whether this instance ran the export (else it found it cached)
        self._session: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def model_path(self) -> Path:
        return self._reference.model_path or default_model_path()

    @property
    def name(self) -> str:
        return f"{self._reference.name}+{self.backend}-{self.precision}"

    @property
    def export_path(self) -> Path:
        """Where this machine's export lives: keyed by the model, the runtime, the CPU."""
        raise NotImplementedError

    def export(self, model_path: Path, target: Path, fp32: Path | None = None) -> None:
        """Write the export of `model_path` at `target` (atomically), from `fp32` if given."""
        raise NotImplementedError

    def open(self, target: Path) -> Any:
        """The runtime's session over the export at `target`."""
        raise NotImplementedError

    def run(self, session: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """[B, D] unit embeddings of one padded batch."""
        raise NotImplementedError

    def ensure_export(self, fp32: Path | None = None) -> Path:
        """The export's path, made now (under a file lock, once per machine) if absent."""
        target = self.export_path
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(target.with_suffix(".lock")):
                if not target.exists():  # another process may have made it meanwhile
                    log.info("exporting %s for %s in %s (once per machine)", self.model_path,
                             self.backend, target)  # fmt: skip
                    self.export(self.model_path, target, fp32)
                    self.exported = True
        return target

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._session is not None:
                return self._session, self._tokenizer
            path = self.model_path
            if not path.is_dir():
                raise EmbedderUnavailable(str(path), "not a directory")
            try:
                session = self.open(self.ensure_export())
                tokenizer = load_tokenizer(path)
            except (OSError, ValueError, ImportError, RuntimeError) as exc:
                raise EmbedderUnavailable(str(path), f"{type(exc).__name__}: {exc}") from exc
            self._session, self._tokenizer = session, tokenizer
            return session, tokenizer

    @property
    def dimension(self) -> int:
        self._load()
        return self._reference_dimension()

    def batches(self, texts: Sequence[str]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        _, tokenizer = self._load()
        return padded_batches(tokenizer, texts, self.batch_size, progress=self.progress)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        session, _ = self._load()
        if len(texts) == 0:
            return np.zeros((0, self._reference_dimension()), dtype=np.float32)
        out: np.ndarray | None = None
        for idx, ids, mask in self.batches(texts):
            rows = self.run(session, ids, mask)
            if out is None:
                out = np.empty((len(texts), rows.shape[1]), dtype=np.float32)
            out[idx] = rows
        assert out is not None
        return out

    def _reference_dimension(self) -> int:
        config = json.loads((self.model_path / "config.json").read_text())
        return int(config["hidden_size"])


class OnnxEmbedder(ExportedEmbedder):
    """all-MiniLM-L6-v2 (or another transformer + mean pooling + normalize model) as a
    dynamically quantized int8 ONNX Runtime session, exported on first use (or found in
    `cache_dir`). `threads`: ONNX Runtime's intra-op threads."""

    backend = "onnxruntime"

    @property
    def export_path(self) -> Path:
        import onnxruntime

        folder = cache_key_dir(self.cache_dir, self._reference.name, _RECIPE, onnxruntime.__version__)
        return folder / "model.int8.onnx"

    def export(self, model_path: Path, target: Path, fp32: Path | None = None) -> None:
        export_int8(model_path, target, fp32=fp32)

    def open(self, target: Path) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # idle workers sleep rather than spin: a sidecar's spare cycles belong to serving
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(target), options, providers=["CPUExecutionProvider"])

    def run(self, session: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return np.asarray(session.run(None, feeds)[0])
