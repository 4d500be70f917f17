"""Which decode path a model runs on, chosen by measuring this machine at load.

Two paths for CPU fp32 decode: `eager` (torch ops, oneDNN-blocked weights, projection.py; MKL where
oneDNN is absent, and for small lm heads) and `native` (the C library of native.py: its packed
products for prefill, and the whole decode step in one call, native_step.py). Which is
faster depends on the CPU (its vector width, caches, memory), on the thread count and on the
model's shapes, so it is not fixed from one machine's results: at the first load on a
machine, `choose` times decode steps of a stand-in model with the model's layer shapes on
both paths at batch 1 and 8, alternating the two in rounds, and keeps the faster (and times
prefills of PROMPTS tokens through the native step against the eager forward, kept per
prompt length: `NativeStep.prefills`). The
verdict is cached in `cache_dir` per CPU model, torch version, library build and shapes, so a restart only
loads the library (native.py: the packaged one for this CPU's instruction-set level) and reads the verdict.

Never an error: no library for this CPU (another architecture, a package built without them)
or one that will not load leaves the model on the eager path with one log line, and `MoEModel.engine_path` says which path it is on and
why (the collectors export it as `infersight_engine_path_info`). int8 and int4 weight-only
models (bf16 activations) have native steps of their own, measured on the loaded model
(`settle`); other devices and dtypes have no native path (`eager`, reason "not applicable").
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import native, native_step
from .config import ModelConfig
from .errors import InvalidInput, KernelUnavailable
from .native import cpu_model
from .network import AttentionStep, KVCache, Transformer, build, state_shapes

__all__ = ["PATHS", "EnginePath", "annotate", "choose", "cpu_model", "default_cache_dir", "settle"]

log = logging.getLogger("infersight.engine")

PATHS = ("auto", "eager", "native")  # what `load(..., engine_path=)` accepts
ROWS = (1, 8)  # the row counts measured: batch-1 and batch-8 decode
STREAM_BYTES = 32 << 20  # weights cycled per measurement, beyond the caches as in real decode
STAND_IN_VOCAB = 1024  # the measuring model's vocabulary: its head is one product on either path
STAND_IN_CONTEXT = 48  # the measured steps attend over this many cached positions
STEPS_PER_ROUND = 4
PROMPTS = (16, 128)  # prompt lengths at which prefill is measured: the native step's rows against eager
TO_MEASURE = "to measure"  # choose's reason for a path that `settle` measures on the loaded model
BUDGET_S = 4.0  # measuring never holds a load up much longer (serve's start must stay < +30 s)


Ratios = tuple[tuple[int, float], ...]  # (rows or prompt tokens, eager time / native time)


@dataclass(frozen=True)
class EnginePath:
    """The path a loaded model decodes on, and why."""

    name: str  # "eager" | "native"
    cpu: str  # the CPU model the choice was made for
    reason: str  # "measured", "cached", "requested", "not applicable", or why the native path failed
    setup_s: float  # time this load spent building and measuring (0 when nothing was done)
    speedups: Ratios = ()  # (rows, eager time / native time) as measured
    # the native library's loops ("avx512-bf16", "avx512-vnni", "avx512", "avx2", "plain"); eager: "none"
    kernels: str = "none"
    activations: str = (
        ""  # what the products read: "fp32", "bf16" (eager int8/int4, native fp8 with BF16) or "int8"
    )

    def describe(self) -> str:
        ratios = ", ".join(f"{rows} rows {ratio:.2f}x" for rows, ratio in self.speedups)
        return f"{self.name} ({self.reason}{'; native vs eager: ' + ratios if ratios else ''})"


def default_cache_dir() -> Path:
    """$INFERSIGHT_CACHE_DIR/engine, else $XDG_CACHE_HOME (or ~/.cache)/infersight/engine."""
    root = os.environ.get("INFERSIGHT_CACHE_DIR")
    if root:
        return Path(root) / "engine"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "infersight" / "engine"


def choose(
    config: ModelConfig,
    *,
    requested: str,
    device: torch.device,
    dtype: torch.dtype,
    quantize: str | None,
    cache_dir: Path | None = None,
) -> tuple[EnginePath, native.NativeKernels | None]:
    """The path for a model about to be bound, and the native kernels when that path is native."""
    if requested not in PATHS:
        raise InvalidInput(f"engine_path must be one of {', '.join(PATHS)}, got {requested!r}")
    cpu = cpu_model() if device.type == "cpu" else device.type
    int8 = quantize in ("int8", "int4", "fp8") and dtype == torch.bfloat16  # int4, fp8: int8's way
    if device.type != "cpu" or not (int8 or (dtype == torch.float32 and quantize is None)):
        return EnginePath("eager", cpu, "not applicable", 0.0), None
    if requested == "eager":
        return EnginePath("eager", cpu, "requested", 0.0), None
    start = time.perf_counter()
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    try:
        kernels = native.kernels(cache_dir, cpu=cpu)
    except KernelUnavailable as exc:
        log.warning("engine: native kernels unavailable (%s); decoding on the eager path", exc)
        return EnginePath("eager", cpu, f"fallback: {exc}", time.perf_counter() - start), None
    if requested == "native":
        return EnginePath("native", cpu, "requested", time.perf_counter() - start), kernels

    verdicts = _read_verdicts(cache_dir)
    found = verdicts.get(_key(cpu, config, quantize, kernels))
    if found is not None:
        speedups = _pairs(found["speedups"])
        name, reason = str(found["path"]), "cached"
    elif int8:  # quantised models are packed from the loaded weights: both paths run on it (`settle`)
        return EnginePath("native", cpu, TO_MEASURE, time.perf_counter() - start), kernels
    else:
        try:
            speedups, prefill = measure(kernels, config)
        except Exception as exc:  # a kernel that fails on this machine must not stop the load
            log.warning("engine: measuring the native kernels failed (%s); decoding on the eager path", exc)
            return EnginePath("eager", cpu, f"fallback: {exc}", time.perf_counter() - start), None
        name, reason = ("native" if _native_wins(speedups) else "eager"), "measured"
        verdicts[_key(cpu, config, quantize, kernels)] = {
            "path": name,
            "speedups": [list(s) for s in speedups],
            "prefill": [list(s) for s in prefill],
        }
        _write_verdicts(cache_dir, verdicts)
    path = EnginePath(name, cpu, reason, time.perf_counter() - start, speedups)
    log.info("engine: decoding on the %s path", path.describe())
    return path, kernels if name == "native" else None


def settle(
    path: EnginePath,
    network: Transformer,
    step: native_step.NativeStep | None,
    *,
    quantize: str | None,
    cache_dir: Path | None = None,
) -> EnginePath:
    """The final path of a bound network: `path` itself, unless `choose` left it to measure on
    the loaded model (int8), or the native path has no step for this network (then eager).

    int8 on a CPU with int8-activation loops (AVX512-VNNI or AVX2) has two native variants
    (`NativeStep.act8`: int8 activations and dpbusd or vpmaddubsw, or fp32 activations and
    the weights dequantised in registers); both are timed against eager and the verdict keeps
    the faster (a restart reads it back). When requested without a measurement, int8
    activations where the CPU has those loops. int4 has one native variant (int8 activations;
    only where the CPU has them, else `step` is None), timed the same way.

    Prefill: the native step also takes a prompt as rows of one slot (`NativeStep.prefill`);
    the same measurement times it against the eager forward for prompts of PROMPTS tokens
    and `NativeStep.prefills` picks, per prompt, by the nearer measured length (fp32's ratios
    come from `choose`'s verdict)."""
    if path.name == "native" and step is None:
        return dataclasses.replace(path, name="eager", reason="not applicable")
    if step is None:
        return path
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    key = _key(path.cpu, network.config, quantize, step.kernels)
    if path.reason != TO_MEASURE:  # fp32's verdict was measured by `choose`; any verdict read back here
        verdict = _read_verdicts(cache_dir).get(key, {}) if path.reason != "requested" else {}
        step.act8 = bool(verdict.get("act8", True))
        step.prefill_speedups = _pairs(verdict.get("prefill", ()))
        return path
    start = time.perf_counter()
    timed: dict[bool, tuple[Ratios, Ratios]] = {}
    try:
        # fp8 has one native variant too: its bytes decoded in registers, against fp32
        # activations or (builds with AVX512-BF16) bf16 ones
        one = (True,) if step.int4 else (False,) if step.fp8 else None
        for act8 in one or ((False, True) if step.kernels.int8_dot else (False,)):
            step.act8 = act8
            timed[act8] = _timed(
                network, step, network.config.num_hidden_layers, network.embeddings.dtype, rounds=5
            )
    except Exception as exc:  # a kernel that fails on this machine must not stop the load
        log.warning("engine: measuring the native step failed (%s); decoding on the eager path", exc)
        return EnginePath("eager", path.cpu, f"fallback: {exc}", path.setup_s + time.perf_counter() - start)
    act8 = max(timed, key=lambda a: statistics.geometric_mean(x for _, x in timed[a][0]))
    (speedups, prefill), step.act8 = timed[act8], act8
    step.prefill_speedups = prefill
    name = "native" if _native_wins(speedups) else "eager"
    verdicts = _read_verdicts(cache_dir)
    verdicts[key] = {
        "path": name,
        "speedups": [list(s) for s in speedups],
        "act8": act8,
        "prefill": [list(s) for s in prefill],
    }
    _write_verdicts(cache_dir, verdicts)
    settled = EnginePath(name, path.cpu, "measured", path.setup_s + time.perf_counter() - start, speedups)
    log.info("engine: decoding on the %s path%s", settled.describe(), " (int8 activations)" if act8 else "")
    return settled


def annotate(path: EnginePath, step: native_step.NativeStep | None, dtype: torch.dtype) -> EnginePath:
    """`path` with what it runs on: the native library's loops and the activations' precision
    (int8 where the native step quantises them), for `infersight_engine_path_info`."""
    if path.name == "native" and step is not None:
        acts = "int8" if step.act8 or step.int4 else "bf16" if step.model.fp8_packed and step.kernels.bf16 else "fp32"
        return dataclasses.replace(path, kernels=step.kernels.isa, activations=acts)
    return dataclasses.replace(
        path,
        kernels="none",
        activations={torch.float32: "fp32", torch.bfloat16: "bf16"}.get(
            dtype, str(dtype).removeprefix("torch.")
        ),
    )


def _key(cpu: str, config: ModelConfig, quantize: str | None, kernels: native.NativeKernels) -> str:
    """What a verdict holds for: the CPU, torch, the library build (its level and the hash of
    its bytes: changed kernels are measured again), fp32 or int8, and the shapes."""
    c = config
    return (
        f"{cpu}|torch {torch.__version__}|{kernels.key}|step {quantize or 'fp32'}|{_shapes(c)}"
        f"|{c.num_local_experts}x{c.num_experts_per_tok}"
    )


def measure(
    kernels: native.NativeKernels,
    config: ModelConfig,
    *,
    rounds: int = 7,
    budget_s: float = BUDGET_S,
) -> tuple[Ratios, Ratios]:
    """(rows, eager step time / native step time), and (prompt tokens, eager prefill time /
    native prefill time) at PROMPTS: whole decode steps of a stand-in model with
    `config`'s layer shapes and random weights, bound once each way, at batch 1 and 8; the
    fastest of `rounds` alternated rounds. As many layers as fit STREAM_BYTES (at least one, at
    most the model's), so that their weights stream from memory as in real decode; a small
    vocabulary (the lm head is one product on either path).

    Timed on one thread in this thread's CPU time: other processes (a shared machine) and
    the serving loop's threads cannot inflate it, where wall-clock timing of two OpenMP
    threads on a busy machine swung 100x between rounds. (The native step's other gain, one
    fork-join per phase instead of one per op, only shows with more threads: this errs
    towards eager.) Past `budget_s` it stops after two rounds per row count."""
    c = config
    layer_bytes = (
        4
        * c.hidden_size
        * (
            (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
            + c.num_attention_heads * c.head_dim
            + 3 * c.num_local_experts * c.intermediate_size
        )
    )
    layers = max(1, min(c.num_hidden_layers, STREAM_BYTES // layer_bytes))
    stand_in = dataclasses.replace(c, num_hidden_layers=layers, vocab_size=min(c.vocab_size, STAND_IN_VOCAB))
    eager = _stand_in(stand_in, None)
    step = native_step.step_for(_stand_in(stand_in, kernels), kernels)
    if step is None:  # not for a CPU fp32 network bound on the native kernels: a bug, not a machine's lack
        raise KernelUnavailable("no native step for the stand-in network")
    return _timed(eager, step, layers, torch.float32, rounds=rounds, budget_s=budget_s)


def _timed(
    eager: Transformer,
    step: native_step.NativeStep,
    layers: int,
    dtype: torch.dtype,
    *,
    rounds: int,
    budget_s: float = BUDGET_S,
) -> tuple[Ratios, Ratios]:
    """(rows, eager / native step time) at ROWS rows, and (tokens, eager / native prefill
    time) at PROMPTS: `eager` run as a network, `step` as the C call."""
    deadline = time.perf_counter() + budget_s
    c, context = eager.config, STAND_IN_CONTEXT
    cache = KVCache.allocate(
        layers=layers,
        max_batch=max(ROWS),
        kv_heads=c.num_key_value_heads,
        max_seq_len=context,
        head_dim=c.head_dim,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    cache.k.normal_()
    cache.v.normal_()
    prompt_cache = KVCache.allocate(
        layers=layers,
        max_batch=1,
        kv_heads=c.num_key_value_heads,
        max_seq_len=max(PROMPTS),
        head_dim=c.head_dim,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this thread's OpenMP setting: a serving loop elsewhere keeps its own
    try:
        with torch.inference_mode():
            decode = tuple(
                (rows, _ratio(eager, step, cache, rows, context - 1, rounds, deadline)) for rows in ROWS
            )
            prefill = tuple(
                (tokens, _prefill_ratio(eager, step, prompt_cache, tokens, rounds, deadline))
                for tokens in PROMPTS
            )
            return decode, prefill
    finally:
        torch.set_num_threads(threads)


def _stand_in(config: ModelConfig, kernels: native.NativeKernels | None) -> Transformer:
    """A network of `config`'s shapes with random weights, bound for the native path (`kernels`) or the eager one."""
    generator = torch.Generator().manual_seed(0)
    shapes = state_shapes(config)
    state = {k: torch.empty(s).normal_(0.0, 0.05, generator=generator) for k, s in shapes.items()}
    return build(config, state, kernels=kernels)


def _ratio(
    eager: Transformer,
    step: native_step.NativeStep,
    cache: KVCache,
    rows: int,
    position: int,
    rounds: int,
    deadline: float,
) -> float:
    """eager step time / native step time at `rows` rows, every row at `position`, in this thread's CPU time."""
    ids = torch.arange(rows) % eager.config.vocab_size
    slots = torch.arange(rows)
    positions = torch.full((rows,), position)
    attention = AttentionStep(
        cache=cache,
        rows=slice(0, rows),
        slots=slots,
        positions=positions,
        write_at=position,
        kv_len=position + 1,
    )
    sides: dict[str, Callable[[], torch.Tensor]] = {
        "eager": lambda: eager(
            ids[:, None], positions[:, None], attention, span=position + 1, last_only=True
        ),
        "native": lambda: step(cache, slots, ids, positions),
    }
    return _alternated(sides, STEPS_PER_ROUND, rounds, deadline)


def _alternated(
    sides: dict[str, Callable[[], torch.Tensor]], calls: int, rounds: int, deadline: float
) -> float:
    """eager time / native time: `calls` calls of each side a round, the sides alternated,
    after one warm-up call each (oneDNN sets up each weight at its first); the fastest round
    of each in this thread's CPU time; past `deadline`, no more than two rounds."""
    times: dict[str, list[float]] = {"eager": [], "native": []}
    for run in sides.values():
        run()
    for done in range(rounds):
        if done >= 2 and time.perf_counter() > deadline:
            break
        for name, run in sides.items():
            t0 = time.thread_time()
            for _ in range(calls):
                run()
            times[name].append(time.thread_time() - t0)
    return min(times["eager"]) / max(min(times["native"]), 1e-9)


def _prefill_ratio(
    eager: Transformer,
    step: native_step.NativeStep,
    cache: KVCache,
    tokens: int,
    rounds: int,
    deadline: float,
) -> float:
    """eager prefill time / native prefill time of one `tokens`-token prompt, in this thread's CPU time."""
    ids = torch.arange(tokens) % eager.config.vocab_size
    positions = torch.arange(tokens)[None]
    attention = AttentionStep(cache=cache, rows=slice(0, 1))  # causal over the prompt
    sides: dict[str, Callable[[], torch.Tensor]] = {
        "eager": lambda: eager(ids[None], positions, attention, span=tokens, last_only=True),
        "native": lambda: step.prefill(cache, 0, ids),
    }
    return _alternated(sides, 1, rounds, deadline)


def _native_wins(speedups: Ratios) -> bool:
    """Native when it is faster over batch-1 and batch-8 together (geometric mean)."""
    return statistics.geometric_mean(x for _, x in speedups) > 1.0


def _pairs(stored: Any) -> Ratios:
    """A verdict's [[n, ratio], ...] back as pairs; () for anything else (an older verdict)."""
    try:
        return tuple((int(n), float(x)) for n, x in stored)
    except (TypeError, ValueError):
        return ()


def _shapes(config: ModelConfig) -> tuple[tuple[int, int], ...]:
    """The (N, K) of the projections the native path replaces: QKV, output, w1|w3, w2."""
    c = config
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    return (
        (qkv, c.hidden_size),
        (c.hidden_size, c.num_attention_heads * c.head_dim),
        (2 * c.intermediate_size, c.hidden_size),
        (c.hidden_size, c.intermediate_size),
    )


def _read_verdicts(cache_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((cache_dir / "paths.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_verdicts(cache_dir: Path, verdicts: dict[str, Any]) -> None:
    """Best effort (a read-only cache only costs a re-measurement next time); atomic replace."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f"paths.json.{os.getpid()}"
        tmp.write_text(json.dumps(verdicts, indent=1, sort_keys=True))
        os.replace(tmp, cache_dir / "paths.json")
    except OSError as exc:
        log.info("engine: could not cache the path verdict in %s: %s", cache_dir, exc)
