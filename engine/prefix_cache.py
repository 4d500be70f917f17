"""PrefixCache: the keys and values of prompt prefixes the runtime has already prefilled.

A prompt is cut into blocks of `block_tokens` tokens. Block i of a prompt is keyed by the
serving version and a chained hash: hash(key of block i-1, tokens of block i), so a key
names the whole prefix up to the end of its block (as vLLM's prefix caching does) and two
versions never share a block. A new request reuses the longest chain of cached blocks at
the head of its prompt and prefills only the rest (`MoEModel.prefill_blocks`).

Memory is bounded by `max_bytes`: past it, the least recently used blocks are evicted
(LRU over blocks; a hit or a store makes a block the most recent). An evicted block in the
middle of a chain only shortens later lookups: a chain is used up to its first gap.

An optional shared tier (`SharedTier`, e.g. `RedisTier`) holds the same blocks for other
replicas: a lookup that runs out of local blocks asks the tier for the rest of the chain,
and every block stored locally is written through. A failing tier is counted and skipped;
serving never waits on it for long nor fails because of it.

Thread-safe: the loop thread serves from it while a deploy preloads the next version.

RedisTier: the prefix cache's shared tier in Redis, so that a new replica starts warm.

Used only when a Redis URL is configured; the `redis` client is imported here, on first
use (`pip install infersight[redis]`). A block is stored under `<key_prefix><version>:<hash>`
as safetensors bytes (keys and values), optionally with a TTL; a lookup fetches a whole
chain in one MGET, a store writes all new blocks in one pipeline.

Each stored value carries a keyed seal: an HMAC-SHA256, under a secret every replica is
given (at least 32 bytes; `SealKeyInvalid` otherwise), of the full key (which names the
version and the whole prefix through the chained hash), the version's weights digest, the
block's token ids and the block's bytes, compared in constant time on every read. Anyone
who can write to Redis, which is whom the seal is against, may copy a value to another
key, truncate it, or rewrite its tensors and seal them again as the format says: without
the secret the seal does not match, and the block is `Rejected`: a miss, counted by reason
(`seal`, `format`, `payload`) and logged at most once a minute with the counts, never
served. Blocks of other weights under a reused version name are rejected alike.

Any failure (refused, timed out, a bad payload) raises `SharedTierUnavailable`, which the
cache counts and serves around. After a failure the tier is skipped for `retry_s`, so an
unreachable Redis costs one short timeout per `retry_s`, not one per request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from .errors import SealKeyInvalid, SharedTierUnavailable

__all__ = [
    "MIN_SEAL_KEY_BYTES",
    "REJECTED",
    "REJECT_REASONS",
    "KVBlock",
    "PrefixCache",
    "PrefixCacheStats",
    "RedisTier",
    "Rejected",
    "SharedTier",
    "block_keys",
    "frequent_prefixes",
]


log = logging.getLogger(__name__)

KVBlock = tuple[torch.Tensor, torch.Tensor]  # keys, values: each [layers, kv_heads, block_tokens, hd]


# why a shared-tier value was not served: its seal does not match (forged, copied from
# another key, altered, truncated, other weights or another secret); it is not in the format
# (foreign, or cut before its seal); sealed, yet not a block (only a key holder writes that)
REJECT_REASONS = ("seal", "format", "payload")


@dataclass(frozen=True, slots=True)
class Rejected:
    """get_many: a value is there, but is not served; `reason` is one of REJECT_REASONS."""

    reason: str


REJECTED = Rejected("seal")  # the common case: a value whose seal does not match


class SharedTier(Protocol):
    """Blocks shared between replicas, each bound to the token ids it holds (`tokens[i]`
    for `keys[i]`). Both calls raise `SharedTierUnavailable` when the tier fails;
    `get_many` gives, per key, the block, None (absent) or a `Rejected` (a bad value)."""

    def get_many(
        self, keys: Sequence[str], tokens: Sequence[Sequence[int]]
    ) -> list[KVBlock | Rejected | None]: ...

    def put_many(self, blocks: Sequence[tuple[str, Sequence[int], KVBlock]]) -> None: ...


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Counts since start, per version. A hit or a miss is one block of a request's prompt."""

    hits: int = 0  # blocks reused (from memory or the shared tier)
    misses: int = 0  # full blocks that had to be prefilled
    tokens_saved: int = 0  # prompt tokens not prefilled thanks to hits
    bytes_held: int = 0  # bytes of the blocks held in memory now
    blocks_held: int = 0
    evictions: int = 0  # blocks dropped to stay under max_bytes
    shared_hits: int = 0  # of `hits`, blocks fetched from the shared tier
    shared_failures: int = 0  # shared-tier calls that failed (served from memory instead)
    shared_rejected: int = 0  # shared-tier values not served (misses); by reason below
    shared_rejected_seal: int = 0  # the seal did not match: forged, copied, altered, other weights
    shared_rejected_format: int = 0  # not in the tier's format (foreign, or cut before its seal)
    shared_rejected_payload: int = 0  # sealed, but not a block


def block_keys(version: str, ids: Sequence[int], block_tokens: int) -> list[str]:
    """The chained key of every full block of `ids` under `version`."""
    keys: list[str] = []
    parent = hashlib.blake2b(version.encode(), digest_size=16).hexdigest()
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(parent.encode(), digest_size=16)
        h.update(",".join(str(int(t)) for t in ids[start : start + block_tokens]).encode())
        parent = h.hexdigest()
        keys.append(f"{version}:{parent}")
    return keys


def frequent_prefixes(prompts: Sequence[Sequence[int]], block_tokens: int, top: int) -> list[list[int]]:
    """The `top` most frequent block-aligned prefixes of `prompts`, most frequent first.

    Prompts are counted on a trie of whole blocks: a prefix's count is the number of
    prompts that begin with it. Only the longest prefix at each count is a candidate (a
    node whose every child is shared by fewer prompts): a 300-token system prompt followed
    by a hundred different questions is one prefix of count 100, not 18 of them. Ties go to
    the longer prefix. Prefilling a prefix caches every block of it, so the ancestors of a
    chosen prefix need no entry of their own.
    """
    if top <= 0 or block_tokens < 1:
        return []
    counts: dict[tuple[int, ...], int] = {}
    children: dict[tuple[int, ...], int] = {}  # prefix -> the largest count of a one-block extension
    for prompt in prompts:
        ids = tuple(int(t) for t in prompt)
        for end in range(block_tokens, len(ids) + 1, block_tokens):
            counts[ids[:end]] = counts.get(ids[:end], 0) + 1
    for prefix, n in counts.items():
        parent = prefix[:-block_tokens]
        if parent:
            children[parent] = max(children.get(parent, 0), n)
    candidates = [p for p, n in counts.items() if children.get(p, 0) < n]
    candidates.sort(key=lambda p: (-counts[p], -len(p)))
    return [list(p) for p in candidates[:top]]


class PrefixCache:
    def __init__(
        self, *, block_tokens: int = 64, max_bytes: int = 256 << 20, shared: SharedTier | None = None
    ) -> None:
        if block_tokens < 1 or max_bytes < 0:
            raise ValueError(f"need block_tokens >= 1 and max_bytes >= 0, got {block_tokens}, {max_bytes}")
        self.block_tokens = block_tokens
        self.max_bytes = max_bytes
        self.shared = shared
        self._blocks: OrderedDict[str, tuple[str, KVBlock, int]] = OrderedDict()  # key -> version, kv, bytes
        self._bytes = 0
        self._stats: dict[str, PrefixCacheStats] = {}
        self._lock = threading.Lock()

    def keys(self, version: str, ids: Sequence[int]) -> list[str]:
        return block_keys(version, ids, self.block_tokens)

    def lookup(
        self,
        version: str,
        keys: Sequence[str],
        *,
        count: bool = True,
        tokens: Sequence[Sequence[int]] | None = None,
    ) -> list[KVBlock]:
        """The cached blocks at the head of `keys`, in order, up to the first one not found;
        counted as hits and misses unless `count` is False (a preload is not traffic).
        `tokens[i]`: the token ids of block `keys[i]`, which the shared tier's seal binds;
        without them the shared tier is not asked."""
        found: list[KVBlock] = []
        with self._lock:
            for key in keys:
                entry = self._blocks.get(key)
                if entry is None:
                    break
                self._blocks.move_to_end(key)
                found.append(entry[1])
        shared_hits = failures = 0
        refused: dict[str, int] = {}
        if len(found) < len(keys) and self.shared is not None and tokens is not None:
            rest = keys[len(found) :]
            try:
                fetched = self.shared.get_many(rest, tokens[len(found) : len(keys)])
            except SharedTierUnavailable:
                failures = 1
                fetched = []
            for key, block in zip(rest, fetched, strict=False):
                if block is None or isinstance(block, Rejected):
                    if block is not None:
                        refused = {"shared_rejected": 1, f"shared_rejected_{block.reason}": 1}
                    break
                found.append(block)
                shared_hits += 1
                self._keep(version, key, block)
        if count:
            saved = len(found) * self.block_tokens
            self._count(
                version, hits=len(found), misses=len(keys) - len(found), tokens_saved=saved,
                shared_hits=shared_hits, shared_failures=failures, **refused,
            )  # fmt: skip
        elif failures or refused:
            self._count(version, shared_failures=failures, **refused)
        return found

    def store(
        self,
        version: str,
        blocks: Sequence[tuple[str, KVBlock]],
        *,
        tokens: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Keep freshly prefilled blocks (and write them through to the shared tier, sealed
        to `tokens[i]`, block i's token ids; without them, memory only)."""
        if not blocks:
            return
        for key, block in blocks:
            self._keep(version, key, block)
        if self.shared is not None and tokens is not None:
            try:
                self.shared.put_many(
                    [(key, ids, block) for (key, block), ids in zip(blocks, tokens, strict=True)]
                )
            except SharedTierUnavailable:
                self._count(version, shared_failures=1)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._blocks

    def stats(self) -> dict[str, PrefixCacheStats]:
        """Per version: counters since start and what is held now."""
        with self._lock:
            held: dict[str, tuple[int, int]] = {}
            for version, _, nbytes in self._blocks.values():
                b, n = held.get(version, (0, 0))
                held[version] = (b + nbytes, n + 1)
            out = {}
            for version in {*self._stats, *held}:
                b, n = held.get(version, (0, 0))
                out[version] = replace(
                    self._stats.get(version, PrefixCacheStats()), bytes_held=b, blocks_held=n
                )
            return out

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes

    def _keep(self, version: str, key: str, block: KVBlock) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in block)
        evicted: dict[str, int] = {}
        with self._lock:
            if key in self._blocks:
                self._blocks.move_to_end(key)
                return
            if nbytes > self.max_bytes:
                return
            self._blocks[key] = (version, block, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, (old_version, _, old_bytes) = self._blocks.popitem(last=False)
                self._bytes -= old_bytes
                evicted[old_version] = evicted.get(old_version, 0) + 1
        for old_version, n in evicted.items():
            self._count(old_version, evictions=n)

    def _count(self, version: str, **delta: int) -> None:
        with self._lock:
            s = self._stats.get(version, PrefixCacheStats())
            self._stats[version] = replace(s, **{k: getattr(s, k) + v for k, v in delta.items()})


_MAGIC = b"iskv2:"  # the format of a stored value: magic, keyed seal, safetensors bytes
_SEAL_BYTES = 32
MIN_SEAL_KEY_BYTES = 32  # an HMAC-SHA256 key as long as its output
_REJECT_LOG_S = 60.0  # rejected blocks are logged at most this often, with the counts since


def _seal(secret: bytes, key: str, digest: str, tokens: Sequence[int], payload: bytes) -> bytes:
    """HMAC-SHA256 under `secret` of the full Redis key, the weights digest, the block's token
    ids and its bytes, each length-prefixed so that no two bindings read alike."""
    h = hmac.new(secret, digestmod=hashlib.sha256)
    for part in (key.encode(), digest.encode(), struct.pack(f"<{len(tokens)}q", *tokens)):
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    h.update(payload)
    return h.digest()


class RedisTier:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        secret: bytes | str | None,
        weights_digest: Callable[[str], str],
        key_prefix: str = "infersight:kv:",
        ttl_s: int | None = 24 * 3600,
        timeout_s: float = 0.2,
        retry_s: float = 5.0,
        device: torch.device | str = "cpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`secret`: the seal's key, the same on every replica, at least MIN_SEAL_KEY_BYTES
        (`SealKeyInvalid` otherwise). `weights_digest(version)`: the digest of that version's
        weights (the registry's sha256), which every block is sealed to."""
        if not secret:
            raise SealKeyInvalid("is missing", MIN_SEAL_KEY_BYTES)
        self._secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(self._secret) < MIN_SEAL_KEY_BYTES:
            raise SealKeyInvalid(f"is {len(self._secret)} bytes long", MIN_SEAL_KEY_BYTES)
        self.weights_digest = weights_digest
        self.url, self.key_prefix, self.ttl_s = url, key_prefix, ttl_s
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.device = torch.device(device)
        self._clock = clock
        self._client: Any = None
        self._down_until = 0.0
        self._down = False  # one warning per outage, not one per retry
        self._lock = threading.Lock()
        self._unlogged: dict[str, int] = {}  # rejections since the last log line, by reason
        self._logged_at = -_REJECT_LOG_S

    def get_many(
        self, keys: Sequence[str], tokens: Sequence[Sequence[int]]
    ) -> list[KVBlock | Rejected | None]:
        if not keys:
            return []
        digests = self._digests(keys)
        raw = self._call(lambda c: c.mget([self.key_prefix + k for k in keys]))
        out: list[KVBlock | Rejected | None] = []
        for key, ids, data in zip(keys, tokens, raw, strict=True):
            if data is None:
                out.append(None)
                continue
            out.append(self._read(key, digests[key], ids, bytes(data)))
        rejected = [b.reason for b in out if isinstance(b, Rejected)]
        if rejected:
            self._log_rejected(rejected)
        return out

    def _read(self, key: str, digest: str, ids: Sequence[int], data: bytes) -> KVBlock | Rejected:
        if len(data) < len(_MAGIC) + _SEAL_BYTES or not data.startswith(_MAGIC):
            return Rejected("format")  # foreign, an older unkeyed format, or cut before the seal
        seal, payload = data[len(_MAGIC) : len(_MAGIC) + _SEAL_BYTES], data[len(_MAGIC) + _SEAL_BYTES :]
        expected = _seal(self._secret, self.key_prefix + key, digest, ids, payload)
        if not hmac.compare_digest(seal, expected):
            return Rejected("seal")  # forged, copied from another key, altered, truncated
        try:
            tensors = load_tensors(payload)
            return tensors["k"].to(self.device), tensors["v"].to(self.device)
        except Exception:  # sealed by a holder of the key that stored something else
            return Rejected("payload")

    def _log_rejected(self, reasons: list[str]) -> None:
        """One warning a minute at most, with the counts by reason since the last one."""
        with self._lock:
            for reason in reasons:
                self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            now = self._clock()
            if now - self._logged_at < _REJECT_LOG_S:
                return
            counts, self._unlogged, self._logged_at = self._unlogged, {}, now
        log.warning(
            "prefix cache: %d block(s) in Redis at %s rejected, not served (%s); a seal that does not "
            "match is a forgery, a copy to another key or another seal key", sum(counts.values()),
            self._shown_url(), ", ".join(f"{r}: {n}" for r, n in sorted(counts.items())),
        )  # fmt: skip

    def _digests(self, keys: Sequence[str]) -> dict[str, str]:
        """Each key's version's weights digest (a key is `<version>:<hash>`)."""
        out: dict[str, str] = {}
        for key in keys:
            version = key.rpartition(":")[0]
            try:
                out[key] = str(self.weights_digest(version))
            except Exception as exc:  # a version the registry does not know: nothing to seal to
                raise SharedTierUnavailable(f"no weights digest for {version!r}: {exc}") from exc
        return out

    def put_many(self, blocks: Sequence[tuple[str, Sequence[int], KVBlock]]) -> None:
        if not blocks:
            return
        digests = self._digests([key for key, _, _ in blocks])
        payloads = []
        for key, ids, (k, v) in blocks:
            data = save_tensors({"k": k.contiguous().cpu(), "v": v.contiguous().cpu()})
            seal = _seal(self._secret, self.key_prefix + key, digests[key], ids, data)
            payloads.append((self.key_prefix + key, _MAGIC + seal + data))

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
                f"Redis at {self._shown_url()} failed recently; retrying after {self.retry_s} s"
            )
        try:
            result = fn(self._connection())
        except SharedTierUnavailable:
            raise
        except Exception as exc:  # redis.RedisError, OSError, a missing client
            self._down_until = time.monotonic() + self.retry_s
            if not self._down:
                self._down = True
                log.warning("prefix cache: Redis at %s unreachable (%s); serving from memory, "
                            "retrying every %g s", self._shown_url(), type(exc).__name__, self.retry_s)  # fmt: skip
            raise SharedTierUnavailable(f"Redis at {self._shown_url()}: {type(exc).__name__}") from exc
        if self._down:
            self._down = False
            log.info("prefix cache: Redis at %s reachable again", self._shown_url())
        return result

    def _shown_url(self) -> str:
        """The URL without its password (`redis://:pw@host` -> `redis://***@host`)."""
        scheme, sep, rest = self.url.partition("://")
        return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else self.url

    def _connection(self) -> Any:
        with self._lock:
            if self._client is None:
                import redis  # optional dependency: only a configured Redis tier needs it

                self._client = redis.Redis.from_url(
                    self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s
                )
            return self._client
