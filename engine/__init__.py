"""infersight.engine: an embedded Mixture-of-Experts (Mixtral) inference runtime in plain PyTorch.

    from infersight.engine import load
    model = load("path/to/mixtral-checkpoint", quantize="int8")
    tokens = model.generate(prompt_ids, max_new_tokens=32)   # [B, T] -> [B, 32]

Imports only torch, safetensors and tokenizers, and knows nothing of the monitor, which
observes the serving runtime through `infersight.engine.events`. Exports are resolved lazily
(PEP 562) so that the torch-free leaves (`events`, `errors`) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ModelConfig
    from .deploy import DeployOutcome
    from .errors import (
        CacheCapacityExceeded,
        CanaryRunning,
        CheckpointCorrupt,
        CheckpointError,
        CheckpointMismatch,
        CheckpointNotFound,
        CheckpointRejected,
        ChecksumMismatch,
        DeployRefused,
        EngineError,
        GenerationFailed,
        InvalidArgument,
        InvalidCanaryWeight,
        InvalidInput,
        InvalidRequest,
        InvalidSamplingParams,
        InvalidVersionName,
        KernelUnavailable,
        NoCanary,
        NonFiniteWeights,
        NoPreviousVersion,
        NotACheckpoint,
        PromptTooLong,
        RegistryCorrupt,
        RegistryError,
        RuntimeNotRunning,
        SharedTierUnavailable,
        TokenizerInvalid,
        UnsupportedConfig,
        UnsupportedQuantization,
        VersionExists,
        VersionNotFound,
        WarmupFailed,
    )
    from .loading import load
    from .model import MoEModel
    from .network import KVCache
    from .paths import EnginePath
    from .prefix_cache import PrefixCache, PrefixCacheStats, RedisTier
    from .registry import DeployRecord, Registry, VersionInfo, VersionName
    from .requests import Completion, RequestHandle, sample
    from .runtime import Runtime

# public name -> the module defining it
_EXPORTS: dict[str, str] = {
    "CacheCapacityExceeded": ".errors",
    "CanaryRunning": ".errors",
    "CheckpointCorrupt": ".errors",
    "CheckpointError": ".errors",
    "CheckpointMismatch": ".errors",
    "CheckpointNotFound": ".errors",
    "CheckpointRejected": ".errors",
    "ChecksumMismatch": ".errors",
    "DeployRefused": ".errors",
    "EngineError": ".errors",
    "GenerationFailed": ".errors",
    "InvalidArgument": ".errors",
    "InvalidCanaryWeight": ".errors",
    "InvalidInput": ".errors",
    "InvalidRequest": ".errors",
    "InvalidSamplingParams": ".errors",
    "InvalidVersionName": ".errors",
    "KernelUnavailable": ".errors",
    "NoCanary": ".errors",
    "NoPreviousVersion": ".errors",
    "NonFiniteWeights": ".errors",
    "NotACheckpoint": ".errors",
    "PromptTooLong": ".errors",
    "RegistryCorrupt": ".errors",
    "RegistryError": ".errors",
    "RuntimeNotRunning": ".errors",
    "SharedTierUnavailable": ".errors",
    "TokenizerInvalid": ".errors",
    "UnsupportedConfig": ".errors",
    "UnsupportedQuantization": ".errors",
    "VersionExists": ".errors",
    "VersionNotFound": ".errors",
    "WarmupFailed": ".errors",
    "KVCache": ".network",
    "ModelConfig": ".config",
    "load": ".loading",
    "MoEModel": ".model",
    "EnginePath": ".paths",
    "sample": ".requests",
    # serving: runtime, requests, versions
    "Completion": ".requests",
    "DeployOutcome": ".deploy",
    "DeployRecord": ".registry",
    "Registry": ".registry",
    "RequestHandle": ".requests",
    "Runtime": ".runtime",
    "PrefixCache": ".prefix_cache",
    "PrefixCacheStats": ".prefix_cache",
    "RedisTier": ".prefix_cache",
    "VersionInfo": ".registry",
    "VersionName": ".registry",
    # SLA routing: a fast and a standard path in one runtime
    "PathOverloaded": ".errors",
    "PathSpec": ".routing",
    "RouteQuery": ".routing",
    "RoutingSpec": ".routing",
}

__all__ = [
    "CacheCapacityExceeded",
    "CanaryRunning",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointNotFound",
    "CheckpointRejected",
    "ChecksumMismatch",
    "Completion",
    "DeployOutcome",
    "DeployRecord",
    "DeployRefused",
    "EngineError",
    "EnginePath",
    "GenerationFailed",
    "InvalidArgument",
    "InvalidCanaryWeight",
    "InvalidInput",
    "InvalidRequest",
    "InvalidSamplingParams",
    "InvalidVersionName",
    "KVCache",
    "KernelUnavailable",
    "MoEModel",
    "ModelConfig",
    "NoCanary",
    "NoPreviousVersion",
    "NonFiniteWeights",
    "NotACheckpoint",
    "PathOverloaded",
    "PathSpec",
    "PrefixCache",
    "PrefixCacheStats",
    "PromptTooLong",
    "RedisTier",
    "Registry",
    "RegistryCorrupt",
    "RegistryError",
    "RequestHandle",
    "RouteQuery",
    "RoutingSpec",
    "Runtime",
    "RuntimeNotRunning",
    "SharedTierUnavailable",
    "TokenizerInvalid",
    "UnsupportedConfig",
    "UnsupportedQuantization",
    "VersionExists",
    "VersionInfo",
    "VersionName",
    "VersionNotFound",
    "WarmupFailed",
    "load",
    "sample",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ModuleNotFoundError as exc:  # the engine extra is missing: say so in one line
        if (exc.name or "").split(".")[0] not in ("torch", "safetensors", "tokenizers"):
            raise
        message = f"{__name__}.{name} needs the engine extra: pip install 'infersight[engine]'"
        raise ModuleNotFoundError(message, name=exc.name) from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
