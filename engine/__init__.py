"""infersight.engine: an embedded Mixture-of-Experts (Mixtral) inference runtime in plain PyTorch.

    from infersight.engine import load
    model = load("path/to/mixtral-checkpoint", quantize="int8")
    tokens = model.generate(prompt_ids, max_new_tokens=32)   # [B, T] -> [B, 32]

Imports only torch, safetensors and tokenizers, and knows nothing of the monitor, which
observes the serving runtime through `infersight.engine.events`. Exports are resolved lazily
(PEP 562) so that the torch-free leaves (`events`, `errors`) import without torch. Every error
is in `errors` (all derive from `EngineError`); the network's parts (`KVCache`, `sample`)
stay in their modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ModelConfig
    from .deploy import DeployOutcome
    from .errors import EngineError
    from .loading import load
    from .model import MoEModel
    from .paths import EnginePath
    from .prefix_cache import PrefixCache, PrefixCacheStats, RedisTier
    from .registry import DeployRecord, Registry, VersionInfo, VersionName
    from .requests import Completion, RequestHandle
    from .routing import PathSpec, RouteQuery, RoutingSpec
    from .runtime import Runtime

# public name -> the module defining it
_EXPORTS: dict[str, str] = {
    "load": ".loading",
    "ModelConfig": ".config",
    "MoEModel": ".model",
    "EnginePath": ".paths",
    "EngineError": ".errors",
    # serving: runtime, requests, versions
    "Runtime": ".runtime",
    "Completion": ".requests",
    "RequestHandle": ".requests",
    "Registry": ".registry",
    "DeployOutcome": ".deploy",
    "DeployRecord": ".registry",
    "VersionInfo": ".registry",
    "VersionName": ".registry",
    "PrefixCache": ".prefix_cache",
    "PrefixCacheStats": ".prefix_cache",
    "RedisTier": ".prefix_cache",
    # SLA routing: a fast and a standard path in one runtime
    "PathSpec": ".routing",
    "RouteQuery": ".routing",
    "RoutingSpec": ".routing",
}

__all__ = [
    "Completion",
    "DeployOutcome",
    "DeployRecord",
    "EngineError",
    "EnginePath",
    "MoEModel",
    "ModelConfig",
    "PathSpec",
    "PrefixCache",
    "PrefixCacheStats",
    "RedisTier",
    "Registry",
    "RequestHandle",
    "RouteQuery",
    "RoutingSpec",
    "Runtime",
    "VersionInfo",
    "VersionName",
    "load",
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
