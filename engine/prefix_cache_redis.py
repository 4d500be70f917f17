"""RedisTier: the prefix cache's shared tier in Redis, so that a new replica starts warm.

Used only when a Redis URL is configured; the `redis` client is imported here, on first
use (`pip install infersight[redis]`). A block is stored under `<key_prefix><version>:<hash>`
as safetensors bytes (keys and values), optionally with a TTL; a lookup fetches a whole
chain in one MGET, a store writes all new blocks in one pipeline.

Any failure (refused, timed out, a bad payload) raises `SharedTierUnavailable`, which the
cache counts and serves around. After a failure the tier is skipped for `retry_s`, so an
unreachable Redis costs one short timeout per `retry_s`, not one per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from .errors import SharedTierUnavailable
from .prefix_cache import KVBlock

__all__ = ["RedisTier"]


class RedisTier:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "infersight:kv:",
        ttl_s: int | None = 24 * 3600,
        timeout_s: float = 0.2,
        retry_s: float = 5.0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.url, self.key_prefix, self.ttl_s = url, key_prefix, ttl_s
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.device = torch.device(device)
        self._client: Any = None
        self._down_until = 0.0
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[KVBlock | None]:
        if not keys:
            return []
        raw = self._call(lambda c: c.mget([self.key_prefix + k for k in keys]))
        out: list[KVBlock | None] = []
        for data in raw:
            if data is None:
                out.append(None)
                continue
            try:
                tensors = load_tensors(bytes(data))
                out.append((tensors["k"].to(self.device), tensors["v"].to(self.device)))
            except Exception as exc:  # a foreign or truncated value: as if the tier failed
                raise SharedTierUnavailable(f"unreadable block in Redis at {self.url}: {exc}") from exc
        return out

    def put_many(self, blocks: Sequence[tuple[str, KVBlock]]) -> None:
        if not blocks:
            return
        payloads = [
            (self.key_prefix + key, save_tensors({"k": k.contiguous().cpu(), "v": v.contiguous().cpu()}))
            for key, (k, v) in blocks
        ]

        def write(client: Any) -> None:
            pipe = client.pipeline(transaction=False)
            for key, data in payloads:
                pipe.set(key, data, ex=self.ttl_s)
            pipe.execute()

        self._call(write)

    def clear(self) -> int:
        """Delete every key under `key_prefix` (tests, a retired cluster); the number deleted."""

        def scan_delete(client: Any) -> int:
            n = 0
            for key in client.scan_iter(match=self.key_prefix + "*", count=500):
                n += int(client.delete(key))
            return n

        return int(self._call(scan_delete))

    def _call(self, fn: Any) -> Any:
        if time.monotonic() < self._down_until:
            raise SharedTierUnavailable(
                f"Redis at {self.url} failed recently; retrying after {self.retry_s} s"
            )
        try:
            return fn(self._connection())
        except SharedTierUnavailable:
            raise
        except Exception as exc:  # redis.RedisError, OSError, a missing client
            self._down_until = time.monotonic() + self.retry_s
            raise SharedTierUnavailable(f"Redis at {self.url}: {type(exc).__name__}: {exc}") from exc

    def _connection(self) -> Any:
        with self._lock:
            if self._client is None:
                import redis  # optional dependency: only a configured Redis tier needs it

                self._client = redis.Redis.from_url(
                    self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
                )
            return self._client
