"""Getting a registered version ready to serve, beside the one serving: verify, load, warm up.

Every check runs on the caller's thread while the serving version keeps serving; only a
replica that passed all of them is handed to the loop thread to swap in. A failure
raises a `DeployRefused` subclass that says which check failed and why.

`RuntimeHost` is what the runtime's controls that deploy beside the serving version (the
canary, SLA routing's fast path) use of the `Runtime` holding them: they take it as this
protocol, so they never import runtime.py, which imports them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import torch

from .errors import CheckpointRejected, ChecksumMismatch, DeployRefused, WarmupFailed
from .prefix_cache import PrefixCache
from .registry import VersionInfo, hash_weight_files
from .replica import Replica
from .runtime_loop import LoopState

if TYPE_CHECKING:
    from .registry import Registry

__all__ = ["DeployOutcome", "RuntimeHost", "prepare_replica"]

_WARMUP_PROMPT = 8
_WARMUP_STEPS = 2
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, slots=True)
class DeployOutcome:
    """A completed swap. Times in seconds; the old version may still be draining."""

    from_version: str | None
    to_version: str
    reason: str  # "start", "deploy", "failover", "rollback"
    at: float  # wall clock of the swap
    verify_s: float
    load_s: float
    warmup_s: float
    preload_s: float = 0.0  # prefilling the frequent prompts into the prefix cache
    preloaded_tokens: int = 0  # prompt tokens those prompts left in the prefix cache


class RuntimeHost(Protocol):
    """The runtime as its canary and routing controls see it (`Runtime` is one)."""

    registry: Registry
    _state: LoopState
    _thread: threading.Thread | None
    _deploy_lock: threading.Lock

    @property
    def serving_version(self) -> str | None: ...

    @property
    def is_running(self) -> bool: ...

    def _prepare(
        self, version: str, reason: str, *, from_version: str | None
    ) -> tuple[Replica, DeployOutcome]:
        """Load, verify and warm `version` up beside the serving one; raises DeployRefused."""
        ...

    def _refused(
        self,
        exc: DeployRefused,
        serving: str | None,
        *,
        to_version: str | None = None,
        reason: str = "rollback",
        cause: BaseException | None = None,
    ) -> NoReturn:
        """Record the refusal in the deploy history, tell subscribers, raise `exc`."""
        ...


@dataclass(frozen=True, slots=True)
class PreparedTimings:
    verify_s: float
    load_s: float
    warmup_s: float


def prepare_replica(
    info: VersionInfo,
    *,
    max_batch: int,
    max_seq_len: int,
    device: str | torch.device | None,
    dtype: torch.dtype | None,
    prefix: PrefixCache | None = None,
    prefill_block: int = 64,
) -> tuple[Replica, PreparedTimings]:
    from .loading import load  # the model core; imported here so the registry stays light

    t0 = time.perf_counter()
    verify_checksum(info)
    t1 = time.perf_counter()
    try:
        model = load(info.path, quantize=info.quantize, device=device, dtype=_DTYPES.get(info.quant, dtype))
        replica = Replica(
            info.name, model, max_batch=max_batch, max_seq_len=max_seq_len, prefix=prefix,
            prefill_block=prefill_block,
        )  # fmt: skip
    except Exception as exc:
        raise CheckpointRejected(
            f"version {info.name} did not load: {type(exc).__name__}: {exc}", version=info.name, reason="load"
        ) from exc
    t2 = time.perf_counter()
    warm_up(replica)
    t3 = time.perf_counter()
    return replica, PreparedTimings(verify_s=t1 - t0, load_s=t2 - t1, warmup_s=t3 - t2)


def verify_checksum(info: VersionInfo) -> None:
    try:
        sha256, files = hash_weight_files(info.path)
    except OSError as exc:
        raise ChecksumMismatch(
            f"version {info.name}: weight files unreadable at {info.path}: {exc}",
            version=info.name,
            reason="checksum",
        ) from exc
    if sha256 == info.sha256:
        return
    now, then = dict(files), dict(info.files)
    changed = sorted(n for n in now.keys() | then.keys() if now.get(n) != then.get(n))
    raise ChecksumMismatch(
        f"version {info.name}: weights at {info.path} do not match the registry's sha256 "
        f"{info.sha256[:12]}… (now {sha256[:12]}…; changed: {', '.join(changed) or 'file set'})",
        version=info.name,
        reason="checksum",
    )


def warm_up(replica: Replica) -> None:
    """Prefill two slots and decode a few steps on the replica's own cache; every logit
    must be finite. The slots are free again afterwards (a prefill overwrites them)."""
    vocab = _vocab_size(replica.model)
    batch = min(2, replica.max_batch)
    # two whole chunks and a part: the chunked prefill's paths (first chunk, chunks on top
    # of the cache, a short last one) are all run once before traffic
    prompt = min(2 * replica.prefill_block + _WARMUP_PROMPT, replica.max_seq_len - _WARMUP_STEPS)
    device = replica.device
    try:
        with torch.inference_mode():
            finite = []
            last = []
            for slot in range(batch):
                ids = (torch.arange(prompt, device=device) * 7919 + 101 * (slot + 1)) % vocab
                logits = replica.prefill_uncached(slot, ids.tolist())
                finite.append(torch.isfinite(logits).all())
                last.append(logits.argmax(-1))
            slots = torch.arange(batch, device=device)
            tokens = torch.stack(last)
            for step in range(_WARMUP_STEPS):
                positions = torch.full((batch,), prompt + step, dtype=torch.long, device=device)
                logits = replica.model.decode(replica.cache, slots, tokens, positions)
                finite.append(torch.isfinite(logits).all())
                tokens = logits.argmax(-1)
            ok = bool(torch.stack(finite).all())
    except Exception as exc:
        raise WarmupFailed(
            f"version {replica.version}: warm-up raised {type(exc).__name__}: {exc}",
            version=replica.version,
            reason="warmup",
        ) from exc
    if not ok:
        raise WarmupFailed(
            f"version {replica.version}: non-finite logits (NaN or Inf) on the warm-up batch",
            version=replica.version,
            reason="non-finite logits",
        )


def _vocab_size(model: Any) -> int:
    return int(model.config.vocab_size)
