"""engine_vs_llamacpp.py's llama.cpp side and the measurement protocol both sides share.

llama.cpp runs in a throwaway venv outside the repository (`ensure_venv`: numpy, gguf,
safetensors and llama-cpp-python, which compiles llama.cpp for this CPU). `Worker` starts
this file in that venv as a process that keeps its models and contexts loaded and answers
one JSON request a line on its stdin (`worker`): export a transformers Mixtral checkpoint to
GGUF (`export_gguf`), re-quantize a GGUF, load one, read its logits, measure it
(`LlamaSide`). Nothing here imports torch or infersight at the top: the worker's venv has
neither.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _smollm2_sides import LLAMA_FTYPES

VENV = Path(
    os.environ.get("INFERSIGHT_LLAMACPP_VENV", "~/.cache/infersight-bench/llamacpp-venv")
).expanduser()
PACKAGES = ["llama-cpp-python", "gguf", "safetensors", "numpy"]
PROMPTS = {"decode": 8, "decode@128": 128}  # tokens each decode sequence is prefilled with
# wall: elapsed time (a quiet machine); cpu: the measuring process's CPU time, which other
# processes on a shared machine cannot inflate by preempting it. cpu is only meaningful with
# one thread (with more, it counts the threads' spin-waiting too).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def repeated(min_s: float, once: Callable[[], tuple[int, float]]) -> float:
    """Tokens/s over as many runs of `once` (its setup untimed; -> tokens, seconds timed) as
    add up to `min_s` timed seconds: a 16-token prefill or 32 small decode steps take a few
    milliseconds, too short for one reading to mean much."""
    tokens, seconds = 0, 0.0
    while seconds < min_s or tokens == 0:
        n, elapsed = once()
        tokens, seconds = tokens + n, seconds + elapsed
    return tokens / seconds


def _permute_rope(w: Any, heads: int) -> Any:
    """HF q/k rows [H * hd, D] rotate pairs (i, i + hd/2) (NeoX order); llama.cpp's llama
    architecture rotates adjacent pairs (2i, 2i+1): interleave each head's two halves."""
    rows, cols = w.shape
    hd = rows // heads
    return w.reshape(heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def export_gguf(checkpoint: Path, out: Path, qtype: str) -> None:
    """A transformers Mixtral checkpoint (one safetensors file) -> a GGUF file of llama.cpp's
    "llama" architecture with stacked experts. Norms and the router stay f32; every other
    weight (embedding and lm head included, as llama.cpp's converter does) is `qtype`."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    cfg = json.loads((checkpoint / "config.json").read_text())
    # transformers 5 writes "head_dim": null and keeps rope_theta under rope_parameters
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    H, Hkv, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_local_experts"]
    t = load_file(str(checkpoint / "model.safetensors"))
    kind = {"f32": gguf.GGMLQuantizationType.F32, "q8_0": gguf.GGMLQuantizationType.Q8_0,
            "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype]  # fmt: skip
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype]  # fmt: skip

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"infersight-bench-{qtype}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(file_type)
    w.add_tokenizer_model("none")  # token ids only: llama.cpp makes vocab_size dummy tokens

    def put(name: str, a: Any, *, keep_f32: bool = False) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if keep_f32 or kind == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)

    head = t["lm_head.weight"] if "lm_head.weight" in t else t["model.embed_tokens.weight"]
    put("token_embd.weight", t["model.embed_tokens.weight"])
    put("output_norm.weight", t["model.norm.weight"], keep_f32=True)
    put("output.weight", head)
    for n in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{n}.", f"blk.{n}."
        put(b + "attn_norm.weight", t[p + "input_layernorm.weight"], keep_f32=True)
        put(b + "attn_q.weight", _permute_rope(t[p + "self_attn.q_proj.weight"], H))
        put(b + "attn_k.weight", _permute_rope(t[p + "self_attn.k_proj.weight"], Hkv))
        put(b + "attn_v.weight", t[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", t[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"], keep_f32=True)
        if p + "mlp.experts.gate_up_proj" in t:  # transformers 5's stacked layout
            gate_up, down = t[p + "mlp.experts.gate_up_proj"], t[p + "mlp.experts.down_proj"]
            inter = gate_up.shape[1] // 2
            gate, up, router = gate_up[:, :inter], gate_up[:, inter:], t[p + "mlp.gate.weight"]
        else:
            x = p + "block_sparse_moe.experts."
            gate = np.stack([t[f"{x}{e}.w1.weight"] for e in range(E)])
            up = np.stack([t[f"{x}{e}.w3.weight"] for e in range(E)])
            down = np.stack([t[f"{x}{e}.w2.weight"] for e in range(E)])
            router = t[p + "block_sparse_moe.gate.weight"]
        put(b + "ffn_gate_inp.weight", router, keep_f32=True)
        put(b + "ffn_gate_exps.weight", gate)
        put(b + "ffn_up_exps.weight", up)
        put(b + "ffn_down_exps.weight", down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class LlamaSide:
    """One GGUF model with a context for up to 8 sequences, measured through the low-level API."""

    def __init__(self, path: str, vocab: int) -> None:
        import llama_cpp as L

        self.L, self.vocab = L, vocab
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 2048, 256, 256, 8
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = 2
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.batch = L.llama_batch_init(256, 0, 8)

    def _run(self, tokens: list[tuple[int, int, int]], logits_all: bool) -> None:
        """One llama_decode of (token, pos, seq) rows."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, (tok, pos, seq) in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits_all or i == len(tokens) - 1
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def last_logits(self, ids: list[int]) -> list[float]:
        """Logits at the last position of one prompt (the exporter's check against the engine)."""
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self._run([(tok, i, 0) for i, tok in enumerate(ids)], False)
        row = L.llama_get_logits_ith(self.ctx, -1)
        return [float(row[i]) for i in range(self.vocab)]

    def measure(
        self, kind: str, size: int, threads: int, steps: int, clock: Callable[[], float], min_s: float
    ) -> float:
        L = self.L
        L.llama_set_n_threads(self.ctx, threads, threads)

        def once() -> tuple[int, float]:
            L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
            if kind == "prefill":
                prompt = [((7 * i + 3) % self.vocab, i, 0) for i in range(size)]
                self._run(prompt[:8], False)  # warm
                L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
                t = clock()
                self._run(prompt, False)
                return size, clock() - t
            prompt = PROMPTS[kind]
            for s in range(size):
                self._run([((11 * s + i) % self.vocab, i, s) for i in range(prompt)], False)
            self._run([((5 * s + 1) % self.vocab, prompt, s) for s in range(size)], True)  # warm step
            t = clock()
            for step in range(steps):
                self._run([((13 * step + s) % self.vocab, prompt + 1 + step, s) for s in range(size)], True)
            return size * steps, clock() - t

        return repeated(min_s, once)


def worker() -> None:
    """Requests on stdin, one JSON object a line: export, load, measure, info."""
    sides: dict[str, LlamaSide] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "export":
                export_gguf(Path(req["checkpoint"]), Path(req["out"]), req["qtype"])
                reply: dict[str, Any] = {"ok": True}
            elif req["op"] == "requantize":  # llama.cpp's own conversion of a GGUF to another type
                import llama_cpp as L

                params = L.llama_model_quantize_default_params()
                params.ftype = LLAMA_FTYPES[req["qtype"]]
                params.allow_requantize = True
                rc = L.llama_model_quantize(req["source"].encode(), req["out"].encode(), params)
                if rc != 0:
                    raise RuntimeError(f"llama_model_quantize returned {rc}")
                reply = {"ok": True}
            elif req["op"] == "load":
                sides[req["key"]] = LlamaSide(req["path"], req["vocab"])
                reply = {"ok": True}
            elif req["op"] == "logits":
                reply = {"ok": True, "logits": sides[req["key"]].last_logits(req["ids"])}
            elif req["op"] == "measure":
                side = sides[req["key"]]
                tok_s = side.measure(
                    req["kind"], req["size"], req["threads"], req["steps"], CLOCKS[req["clock"]], req["min_s"]
                )
                reply = {"ok": True, "tok_s": tok_s}
            else:
                import llama_cpp

                info = llama_cpp.llama_print_system_info().decode()
                reply = {"ok": True, "version": llama_cpp.__version__, "system": info}
        except Exception as exc:  # reported to the parent, which stops
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp, gguf, safetensors, numpy"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"installing {' '.join(PACKAGES)} into {VENV} (compiles llama.cpp: minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    env = os.environ | {"CMAKE_ARGS": os.environ.get("CMAKE_ARGS", llamacpp_cmake_args())}
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir", *PACKAGES], check=True, env=env
    )
    return python


def llamacpp_cmake_args() -> str:
    """Native kernels for this CPU; the multimodal library (unused here) is skipped. On a CPU
    with AMX, llama.cpp's AMX buffer type is compiled out (explicit -mno-amx-* outlive
    -march=native): with it, llama-cpp-python 0.3.36's q8_0 decode of these MoE models died
    with SIGSEGV on a Xeon with AMX-INT8 (llama.cpp's own AMX mul_mat segfault is an open
    issue upstream); its AVX512-VNNI kernels (and the repacked q4_0/q8_0) stay."""
    args = "-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"
    if "amx_int8" in cpu_description()[1].split():
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += f" -DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'"
    return args


class Worker:
    def __init__(self, python: Path) -> None:
        # llama.cpp logs every tensor it loads: its stderr goes to a file, read back only
        # when the worker dies (errors it survives come back as replies)
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (the worker's life long; closed in close())
        self.proc = subprocess.Popen(
            [str(python), __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def ask(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            raise RuntimeError(f"llama.cpp worker died (exit {self.proc.wait(timeout=60)}) on {req}:\n{tail}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"llama.cpp worker: {reply['error']}")
        return reply

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


def cpu_description() -> tuple[str, str]:
    """(model name, the SIMD flags that matter here) of this CPU."""
    from infersight.engine.paths import cpu_model

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                wanted = ("avx2", "fma", "avx512", "amx", "vnni", "bf16", "f16c")
                flags = " ".join(f for f in line.split(":", 1)[1].split() if f.startswith(wanted))
                break
    except OSError:
        pass
    return cpu_model(), flags


if __name__ == "__main__":
    worker()
