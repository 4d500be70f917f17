"""Errors raised by the engine.

    EngineError
     ├── CheckpointError                 a checkpoint directory cannot be served as it is
     │    ├── CheckpointNotFound         a directory, config.json or weight file is missing
     │    ├── CheckpointCorrupt          a weight or index file cannot be parsed
     │    ├── CheckpointMismatch         a tensor is missing, unexpected or has the wrong shape/dtype
     │    ├── NonFiniteWeights           a tensor holds NaN or Inf
     │    ├── UnsupportedConfig          config.json asks for something the engine does not implement
     │    ├── TokenizerInvalid           tokenizer.json is present but cannot be read
     │    └── GGUFError                  a GGUF file cannot be imported (names the file and the field or tensor)
     │         ├── GGUFCorrupt           not a GGUF file, or its data is truncated
     │         ├── GGUFUnsupported       an architecture, tensor type or tokenizer the importer does not implement
     │         └── GGUFMismatch          a tensor is missing or disagrees with the metadata (vocabulary size, shapes)
     ├── UnsupportedQuantization         `quantize=` names a scheme the engine does not have, or one the sizes do not fit
     ├── InvalidArgument                 an argument refused before any work (also a ValueError)
     │    ├── InvalidSamplingParams      temperature < 0, top_p outside (0, 1]
     │    ├── InvalidInput               token ids of the wrong shape, type or range
     │    ├── CacheCapacityExceeded      a sequence or slot does not fit the KV cache
     │    ├── PromptTooLong              serving: a request over the runtime's length limits (at submit)
     │    ├── InvalidRequest             serving: empty prompt, max_new_tokens < 1, bad sampling values
     │    ├── InvalidCanaryWeight        a canary weight outside (0, 1]
     │    ├── SealKeyInvalid             the shared tier's seal key is missing or shorter than 32 bytes
     │    └── CalibrationInvalid         a calibration file with no usable prompt, or texts the model cannot take
     ├── RuntimeNotRunning               serving: submit/deploy before start() or while stopping
     ├── PathOverloaded                  SLA routing: a path's length breaker is open for this length
     ├── QueueFull                       admission: the request's queue is full or its predicted wait too long
     ├── GenerationFailed                serving: the model raised on a request (re-raised by result())
     ├── SharedTierUnavailable           the prefix cache's shared tier (Redis) failed; served locally
     ├── KernelUnavailable               the native decode kernels cannot be built or loaded; eager path used
     ├── RegistryError                   the version registry
     │    ├── InvalidVersionName         breaks [arch]_[dataset]_[quant]-v[major].[minor]
     │    ├── VersionNotFound            no version of that name
     │    ├── VersionExists              versions are immutable: a name registers once
     │    ├── NotACheckpoint             register() given a directory without config.json/safetensors
     │    └── RegistryCorrupt            a metadata or deploy-history file cannot be read
     └── DeployRefused                   a deploy/failover/rollback did not happen; serving went on
          ├── ChecksumMismatch           weight files no longer hash to the registry's sha256
          ├── CheckpointRejected         loading raised (a CheckpointError, ...)
          ├── WarmupFailed               non-finite logits (or an error) on the warm-up batch
          ├── NoPreviousVersion          rollback() with no earlier good version
          ├── CanaryRunning              a canary (or deploy) while a canary is running
          └── NoCanary                   promote/abort/reweight with no canary running

Every checkpoint error is raised before any weight is assigned, so `load` either returns a
whole model or nothing. Argument errors also derive from `ValueError`.
"""

from __future__ import annotations

__all__ = [
    "CacheCapacityExceeded",
    "CalibrationInvalid",
    "CanaryRunning",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointMismatch",
    "CheckpointNotFound",
    "CheckpointRejected",
    "ChecksumMismatch",
    "DeployRefused",
    "EngineError",
    "GGUFCorrupt",
    "GGUFError",
    "GGUFMismatch",
    "GGUFUnsupported",
    "GenerationFailed",
    "InvalidArgument",
    "InvalidCanaryWeight",
    "InvalidInput",
    "InvalidRequest",
    "InvalidSamplingParams",
    "InvalidVersionName",
    "KernelUnavailable",
    "NoCanary",
    "NoPreviousVersion",
    "NonFiniteWeights",
    "NotACheckpoint",
    "PathOverloaded",
    "PromptTooLong",
    "QueueFull",
    "RegistryCorrupt",
    "RegistryError",
    "RuntimeNotRunning",
    "SealKeyInvalid",
    "SharedTierUnavailable",
    "TokenizerInvalid",
    "UnsupportedConfig",
    "UnsupportedQuantization",
    "VersionExists",
    "VersionNotFound",
    "WarmupFailed",
]


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class CheckpointError(EngineError):
    """A checkpoint directory cannot be loaded as it is."""


class CheckpointNotFound(CheckpointError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class CheckpointCorrupt(CheckpointError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class CheckpointMismatch(CheckpointError):
    """`tensor` is the checkpoint key (or the name the engine expected)."""

    def __init__(self, tensor: str, reason: str) -> None:
        self.tensor = tensor
        self.reason = reason
        super().__init__(f"tensor {tensor!r}: {reason}")


class NonFiniteWeights(CheckpointError):
    def __init__(self, tensor: str, count: int) -> None:
        self.tensor = tensor
        self.count = count
        super().__init__(f"tensor {tensor!r} holds {count} NaN or Inf value(s)")


class UnsupportedConfig(CheckpointError):
    """`field` is the config.json key, dotted for nested ones (`rope_parameters.rope_type`)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"config field {field!r}: {reason}")


class TokenizerInvalid(CheckpointError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class GGUFError(CheckpointError):
    """`where` is the GGUF metadata key or tensor name at fault ("" for the file as a whole)."""

    def __init__(self, path: str, where: str, reason: str) -> None:
        self.path = path
        self.where = where
        self.reason = reason
        super().__init__(f"{path}: {where + ': ' if where else ''}{reason}")


class GGUFCorrupt(GGUFError):
    pass


class GGUFUnsupported(GGUFError):
    pass


class GGUFMismatch(GGUFError):
    pass


class UnsupportedQuantization(EngineError, ValueError):
    def __init__(self, scheme: object, supported: tuple[str, ...], *, reason: str | None = None) -> None:
        self.scheme = scheme
        super().__init__(
            f"quantize={scheme!r}: {reason}"
            if reason
            else f"quantize={scheme!r} is not supported; choose one of {', '.join(supported)} or None"
        )


class InvalidArgument(EngineError, ValueError):
    """An argument the engine refuses before doing any work: the family every argument
    check raises (one `except InvalidArgument` catches them all; each is also a ValueError)."""


class CalibrationInvalid(InvalidArgument):
    """`models quantize --method gptq`: the calibration file cannot calibrate this model (no
    usable prompt, no tokenizer to read it with, ids outside the vocabulary)."""


class InvalidSamplingParams(InvalidArgument):
    """temperature < 0, top_p outside (0, 1]."""


class InvalidInput(InvalidArgument):
    """Token ids of the wrong shape, type or range."""


class CacheCapacityExceeded(InvalidArgument):
    """A sequence or slot does not fit the KV cache."""


# --- serving: runtime, registry, deploys (engine/runtime.py, registry.py, deploy.py) ---


class PromptTooLong(InvalidArgument):
    """A request over the runtime's length limits, refused in `submit` before the model."""

    def __init__(self, message: str, *, limit_name: str, limit: int, got: int) -> None:
        super().__init__(message)
        self.limit_name = limit_name
        self.limit = limit
        self.got = got


class InvalidRequest(InvalidArgument):
    """A request with a bad parameter (empty prompt, max_new_tokens < 1, top_p out of range...)."""


class RuntimeNotRunning(EngineError, RuntimeError):
    """`submit`/`deploy` on a runtime that is not started, or is stopping."""


class PathOverloaded(EngineError, RuntimeError):
    """SLA routing shed the request: the path's p99 is over its SLA and the request is longer
    than the breaker's threshold. Retry after `retry_after_s` (the service answers 503)."""

    def __init__(self, message: str, *, path: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.path = path
        self.retry_after_s = retry_after_s


class QueueFull(EngineError, RuntimeError):
    """Admission control refused the request at submit: `waiting` requests are already ahead
    of it in its queue (`path`), beyond `max_queue`, or its predicted wait is over
    `max_queue_wait_s`. Retry after `retry_after_s` (the service answers 429)."""

    def __init__(self, message: str, *, path: str, waiting: int, retry_after_s: float) -> None:
        super().__init__(message)
        self.path = path
        self.waiting = waiting
        self.retry_after_s = retry_after_s


class GenerationFailed(EngineError, RuntimeError):
    """The model raised while serving a request; `result()` re-raises it as this."""


class SharedTierUnavailable(EngineError, RuntimeError):
    """The prefix cache's shared tier did not answer; the cache is counted and goes on locally."""


class SealKeyInvalid(InvalidArgument):
    """The prefix cache's shared tier needs a secret key to seal its blocks with, of at least
    `minimum` bytes: without one, anyone who can write to Redis can forge a block."""

    def __init__(self, reason: str, minimum: int) -> None:
        super().__init__(f"the shared KV tier's seal key {reason}: give a secret of at least {minimum} bytes")
        self.minimum = minimum


class KernelUnavailable(EngineError, RuntimeError):
    """No compiler, a failed build or a library that will not load: `load` logs it once and
    serves on the eager path (paths.py); it never reaches the user."""


class RegistryError(EngineError):
    """Something wrong with the version registry."""


class InvalidVersionName(RegistryError, ValueError):
    """A version name that breaks `[arch]_[dataset]_[quant]-v[major].[minor]` (the rule is in the message)."""


class VersionNotFound(RegistryError, LookupError):
    """No version of that name in the registry."""


class VersionExists(RegistryError):
    """A version of that name is already registered (versions are immutable)."""


class NotACheckpoint(RegistryError):
    """The directory given to `register` has no config.json or no safetensors weights."""


class RegistryCorrupt(RegistryError):
    """A metadata or history file in the registry cannot be read."""


class DeployRefused(EngineError):
    """A deploy, failover or rollback did not happen; the serving version kept serving."""

    def __init__(self, message: str, *, version: str, reason: str) -> None:
        super().__init__(message)
        self.version = version
        self.reason = reason


class ChecksumMismatch(DeployRefused):
    """The weight files on disk no longer hash to the registry's sha256."""


class CheckpointRejected(DeployRefused):
    """Loading the version raised (bad tensors, NaN weights, unsupported config...)."""


class WarmupFailed(DeployRefused):
    """The warm-up batch produced non-finite logits or raised."""


class NoPreviousVersion(DeployRefused):
    """`rollback()` with no earlier good version in the deploy history."""


class CanaryRunning(DeployRefused):
    """A canary or a deploy asked for while a canary is running: finish or abort it first."""


class NoCanary(DeployRefused):
    """Promote, abort or reweight with no canary running."""


class InvalidCanaryWeight(InvalidArgument):
    """A canary's share of traffic outside (0, 1]."""
