"""The prefix KV cache on a real tiny Mixtral: exact reuse, version isolation, LRU bound,
preload at start and deploy, and the shared tier on the machine's real Redis."""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from collections.abc import Callable, Iterator

import _engine_serving_support as support
import pytest
import torch
from _engine_serving_support import V1, V2, prompt
from conftest import free_port, missing_service
from infersight.engine import load
from infersight.engine.errors import SealKeyInvalid
from infersight.engine.model import MoEModel
from infersight.engine.prefix_cache import (
    _MAGIC,
    REJECTED,
    PrefixCache,
    PrefixCacheStats,
    RedisTier,
    Rejected,
    _seal,
    frequent_prefixes,
)
from infersight.engine.registry import Registry
from infersight.engine.runtime import Runtime
from infersight.engine.runtime_loop import Replica, Request
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

tiny_checkpoints, registry, greedy = support.tiny_checkpoints, support.registry, support.greedy  # fixtures
Greedy = Callable[[str, list[int], int], list[int]]
BLOCK = 8
SYSTEM = [(7 * i + 3) % 96 for i in range(40)]  # a shared "system prompt" of 5 blocks


def chat(question: int, n: int = 5) -> list[int]:
    """The shared system prompt followed by a short question of its own."""
    return SYSTEM + prompt(question, n)


def serve(rt: Runtime, jobs: list[tuple[list[int], int, float, int | None]]) -> list[tuple[int, ...]]:
    """Submit the first job, wait for its first token, then the rest join the running batch."""
    first, *rest = jobs
    handles = [rt.submit(first[0], max_new_tokens=first[1], temperature=first[2], seed=first[3])]
    next(iter(handles[0]))
    handles += [rt.submit(p, max_new_tokens=n, temperature=t, seed=s) for p, n, t, s in rest]
    return [h.result(timeout=60).token_ids for h in handles]


def runtime_with(registry: Registry, cache: PrefixCache | None, **kw: object) -> Runtime:
    rt = Runtime(registry, max_batch_size=3, max_prompt_tokens=96, max_seq_len=160, prefix_cache=cache, **kw)  # type: ignore[arg-type]
    rt.start(V1)
    return rt


SECRET = b"k" * 16 + secrets.token_bytes(16)  # the replicas' shared seal key


def digest_of(registry: Registry) -> Callable[[str], str]:
    return lambda version: registry.get(version).sha256


@pytest.fixture
def redis_tier(registry: Registry) -> Iterator[RedisTier]:
    """A RedisTier on the machine's Redis under a fresh key prefix, deleted afterwards."""
    tier = RedisTier(key_prefix=f"infersight-test:{uuid.uuid4().hex[:12]}:", timeout_s=2.0, secret=SECRET,
                     weights_digest=digest_of(registry))  # fmt: skip
    try:
        tier._connection().ping()
    except Exception as exc:
        missing_service(f"Redis at 127.0.0.1:6379 unavailable: {exc}")
    try:
        yield tier
    finally:
        tier.clear()


def _same_bits_from_every_cached_start(model: MoEModel, ids: torch.Tensor) -> torch.Tensor:
    """The block prefill of `ids` from scratch, checked to give the same logit and cache bits
    when its first blocks are copied in instead of computed -> its logits."""
    cold = model.new_cache(1, 64)
    full = model.prefill_blocks(cold, 0, ids, start=0, block=BLOCK)
    for start in (BLOCK, 2 * BLOCK, 5 * BLOCK):
        warm = model.new_cache(2, 64)
        k, v = model.read_kv(cold, 0, 0, start)
        model.write_kv(warm, 1, 0, k, v)
        assert torch.equal(model.prefill_blocks(warm, 1, ids, start=start, block=BLOCK), full)
        assert torch.equal(warm.k[:, 1, :, : len(ids)], cold.k[:, 0, :, : len(ids)])
    return full


def test_suffix_prefill_on_cached_blocks_gives_the_same_logit_bits(tiny_checkpoints: dict) -> None:
    model = load(tiny_checkpoints[V1])
    ids = torch.tensor(chat(1, 7))
    full = _same_bits_from_every_cached_start(model, ids)
    # and the block path agrees with the plain prefill on what a user sees: the next token
    plain = model.prefill(model.new_cache(1, 64), 0, ids)
    assert torch.allclose(plain, full, atol=1e-5, rtol=1e-5)
    assert int(plain.argmax()) == int(full.argmax())


def test_block_prefill_on_the_native_step_is_exact_across_starts_and_is_the_plain_prefill(
    tiny_checkpoints: dict,
) -> None:
    # the block prefill runs on the C step where the model has one: the same bits whichever
    # blocks came from a cache, and, for a prompt in one block, the plain prefill's bits
    model = load(tiny_checkpoints[V1], device="cpu", engine_path="native")
    assert model.native_step is not None
    ids = torch.tensor(chat(1, 7))
    full = _same_bits_from_every_cached_start(model, ids)
    whole = model.prefill_blocks(model.new_cache(1, 64), 0, ids, start=0, block=64)
    assert torch.equal(whole, model.prefill(model.new_cache(1, 64), 0, ids))
    eager = load(tiny_checkpoints[V1], device="cpu", engine_path="eager")
    reference = eager.prefill_blocks(eager.new_cache(1, 64), 0, ids, start=0, block=BLOCK)
    assert torch.allclose(full, reference, atol=1e-4, rtol=1e-4)
    assert int(full.argmax()) == int(reference.argmax())


def test_outputs_are_bit_identical_with_and_without_the_cache_across_batch_compositions(
    registry: Registry,
) -> None:
    # greedy and seeded sampling; prompts that share the system prompt, one that does not,
    # one that is exactly whole blocks; later ones join a batch that is already decoding
    jobs = [
        (chat(1), 12, 0.0, None),
        (chat(2), 9, 0.9, 11),
        (prompt(50, 6), 7, 0.0, None),
        (chat(3, 8), 6, 0.0, None),  # 48 tokens: whole blocks, the last one is prefilled anyway
        (SYSTEM + chat(4)[len(SYSTEM) :], 8, 0.7, 5),
        (chat(1), 12, 0.0, None),  # the same prompt again: every usable block hits
    ]
    off = runtime_with(registry, PrefixCache(block_tokens=BLOCK, max_bytes=0))  # keeps nothing
    try:
        expected = serve(off, jobs)
        assert sum(s.hits for s in off.prefix_cache_stats().values()) == 0
    finally:
        off.stop()
    cache = PrefixCache(block_tokens=BLOCK, max_bytes=64 << 20)
    on = runtime_with(registry, cache)
    try:
        assert serve(on, jobs) == expected  # cold: blocks fill as requests arrive
        assert serve(on, list(reversed(jobs))) == list(reversed(expected))  # warm, other batches
        stats = on.prefix_cache_stats()[V1]
        assert stats.hits > 0 and stats.tokens_saved == stats.hits * BLOCK and stats.misses > 0
        assert stats.bytes_held > 0 and stats.evictions == 0
    finally:
        on.stop()
    plain = runtime_with(registry, None, prefill_block=BLOCK)  # no cache object at all
    try:
        assert serve(plain, jobs) == expected  # every row, sampled ones too, bit for bit
        assert serve(plain, list(reversed(jobs))) == list(reversed(expected))
        assert plain.prefix_cache_stats() == {}
    finally:
        plain.stop()


def test_logits_are_bit_identical_with_and_without_the_cache_in_any_batch(tiny_checkpoints: dict) -> None:
    # the logits of each request's first token and of every later step, with the cache
    # off, cold and warm, each request admitted alone or beside others in another slot
    model = load(tiny_checkpoints[V1])

    def logits_of(
        replica: Replica, batches: list[list[list[int]]]
    ) -> dict[tuple[int, ...], list[torch.Tensor]]:
        seen: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for batch in batches:
            reqs = [Request(str(i), p, 3, 0.0, 1.0, None, 0, None, 0.0) for i, p in enumerate(batch)]  # type: ignore[arg-type]
            with torch.inference_mode():
                for r in reqs:
                    replica.admit(r)
                    first = replica.prefill(r)
                    seen[tuple(r.prompt_ids)] = [first]
                    r.tokens.append(int(first.argmax()))
                for _ in range(3):
                    for r, row in zip(reqs, replica.decode(reqs), strict=True):
                        seen[tuple(r.prompt_ids)].append(row)
                        r.tokens.append(int(row.argmax()))
            for r in reqs:
                replica.release(r)
        return seen

    prompts = [chat(1), chat(2, 9), prompt(50, 6), chat(3, 8)]
    compositions = [
        [[prompts[0]], [prompts[1], prompts[2]], [prompts[3], prompts[0], prompts[1]]],
        [
            [prompts[1], prompts[0], prompts[3]],
            [prompts[2]],
            [prompts[0], prompts[3]],
        ],  # other slots, neighbours
    ]
    off = Replica(V1, model, max_batch=3, max_seq_len=96, prefill_block=BLOCK)
    on = Replica(V1, model, max_batch=3, max_seq_len=96, prefix=PrefixCache(block_tokens=BLOCK))
    for batches in compositions:  # the first is cold for `on`, the second warm
        expected, got = logits_of(off, batches), logits_of(on, batches)
        assert expected.keys() == got.keys()
        for key, rows in expected.items():
            assert len(rows) == len(got[key]) == 4
            assert all(torch.equal(a, b) for a, b in zip(rows, got[key], strict=True))
    assert on.prefix is not None and on.prefix.stats()[V1].hits >= 4 * len(SYSTEM) // BLOCK


def test_versions_never_share_blocks(registry: Registry, greedy: Greedy) -> None:
    cache = PrefixCache(block_tokens=BLOCK, max_bytes=64 << 20)
    rt = runtime_with(registry, cache)
    try:
        rt.submit(chat(1), max_new_tokens=4).result(timeout=60)
        rt.deploy(V2)
        v2 = rt.submit(chat(1), max_new_tokens=6).result(timeout=60)
        assert v2.model_version == V2 and list(v2.token_ids) == greedy(V2, chat(1), 6)
        stats = rt.prefix_cache_stats()
        assert stats[V2].hits == 0 and stats[V2].misses == len(chat(1)) // BLOCK
        assert stats[V1].blocks_held > 0 and stats[V2].blocks_held > 0
    finally:
        rt.stop()


def test_memory_stays_under_the_byte_budget_evicting_least_recently_used_blocks() -> None:
    def block(x: float) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((2, 1, BLOCK, 4), float(x)), torch.full((2, 1, BLOCK, 4), -float(x))

    size = 2 * 2 * BLOCK * 4 * 4  # bytes of one block (k and v, fp32)
    cache = PrefixCache(block_tokens=BLOCK, max_bytes=3 * size)
    keys = [cache.keys("v", list(range(i * 10, i * 10 + BLOCK)))[0] for i in range(5)]
    cache.store("v", [(keys[0], block(0)), (keys[1], block(1)), (keys[2], block(2))])
    assert len(cache.lookup("v", [keys[0]])) == 1  # block 0 is now the most recently used
    cache.store("v", [(keys[3], block(3)), (keys[4], block(4))])
    assert cache.bytes_held == 3 * size
    assert [k in cache for k in keys] == [True, False, False, True, True]
    stats = cache.stats()["v"]
    assert stats == PrefixCacheStats(hits=1, misses=0, tokens_saved=BLOCK, bytes_held=3 * size,
                                     blocks_held=3, evictions=2)  # fmt: skip


def test_frequent_prompts_are_prefilled_at_start_and_at_deploy_before_traffic(registry: Registry) -> None:
    asked: list[str] = []

    def frequent(version: str) -> list[list[int]]:
        asked.append(version)
        return [chat(9, 3), SYSTEM]

    cache = PrefixCache(block_tokens=BLOCK, max_bytes=64 << 20)
    rt = runtime_with(registry, cache, preload_source=frequent)
    try:
        held = rt.prefix_cache_stats()[V1]
        assert asked == [V1] and held.blocks_held == len(chat(9, 3)) // BLOCK and held.hits == 0
        rt.submit(chat(2), max_new_tokens=2).result(timeout=60)
        first = rt.prefix_cache_stats()[V1]
        assert first.hits == len(SYSTEM) // BLOCK and first.misses == 0  # the first request is warm
        outcome = rt.deploy(V2)
        assert asked == [V1, V2] and outcome.preloaded_tokens == len(chat(9, 3)) // BLOCK * BLOCK
        assert rt.prefix_cache_stats()[V2].blocks_held == len(chat(9, 3)) // BLOCK
    finally:
        rt.stop()


def test_a_failing_preload_source_leaves_the_version_serving_cold(registry: Registry) -> None:
    def broken(version: str) -> list[list[int]]:
        raise ConnectionError("store down")

    rt = runtime_with(registry, PrefixCache(block_tokens=BLOCK), preload_source=broken)
    try:
        assert rt.serving_version == V1 and rt.preload_errors == 1
        assert rt.prefix_cache_stats().get(V1, PrefixCacheStats()).blocks_held == 0
        assert len(rt.submit(prompt(77, 20), max_new_tokens=3).result(timeout=60).token_ids) == 3
        assert rt.preload([[*SYSTEM, 5, 6, 7]]) == len(SYSTEM)  # by hand, beside serving
        rt.submit([*SYSTEM, 9], max_new_tokens=1).result(timeout=60)
        assert rt.prefix_cache_stats()[V1].tokens_saved == len(SYSTEM)
    finally:
        rt.stop()


def test_a_new_replica_starts_warm_from_redis(registry: Registry, redis_tier: RedisTier) -> None:
    first = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=redis_tier))
    try:
        expected = first.submit(chat(1), max_new_tokens=8).result(timeout=60).token_ids
    finally:
        first.stop()
    replica = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=redis_tier))
    try:
        assert replica.submit(chat(1), max_new_tokens=8).result(timeout=60).token_ids == expected
        stats = replica.prefix_cache_stats()[V1]
        assert stats.shared_hits == len(chat(1)) // BLOCK and stats.misses == 0 and stats.shared_failures == 0
    finally:
        replica.stop()


def test_a_block_copied_in_redis_to_another_prompts_key_is_a_counted_miss_not_served(
    registry: Registry, redis_tier: RedisTier
) -> None:
    a_prompt, b_prompt = prompt(11, 3 * BLOCK), prompt(12, 3 * BLOCK)
    plain = runtime_with(registry, None)
    try:
        a_answer = plain.submit(a_prompt, max_new_tokens=8).result(timeout=60).token_ids
        b_answer = plain.submit(b_prompt, max_new_tokens=8).result(timeout=60).token_ids
    finally:
        plain.stop()
    assert a_answer != b_answer
    writer = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=redis_tier))
    try:
        writer.submit(b_prompt, max_new_tokens=2).result(timeout=60)  # B's blocks go to Redis
    finally:
        writer.stop()
    cache = PrefixCache(block_tokens=BLOCK, shared=redis_tier)
    a_keys, b_keys = cache.keys(V1, a_prompt), cache.keys(V1, b_prompt)
    client = redis_tier._connection()
    for a_key, b_key in zip(a_keys, b_keys, strict=True):  # what a client with Redis access could do
        client.set(redis_tier.key_prefix + a_key, client.get(redis_tier.key_prefix + b_key))
    replica = runtime_with(registry, cache)
    try:
        assert replica.submit(a_prompt, max_new_tokens=8).result(timeout=60).token_ids == a_answer
        stats = replica.prefix_cache_stats()[V1]
        assert stats.shared_rejected == 1 and stats.shared_hits == 0 and stats.hits == 0, stats
        # B's own blocks still serve B from Redis
        assert replica.submit(b_prompt, max_new_tokens=8).result(timeout=60).token_ids == b_answer
        assert replica.prefix_cache_stats()[V1].shared_hits >= len(b_keys) - 1  # the last block prefills
    finally:
        replica.stop()
    truncated = redis_tier.key_prefix + b_keys[0]
    client.set(truncated, client.get(truncated)[:-7])
    assert redis_tier.get_many([b_keys[0]], [b_prompt[:BLOCK]]) == [REJECTED]
    client.set(truncated, client.get(truncated)[:20])  # cut before the end of its seal
    assert redis_tier.get_many([b_keys[0]], [b_prompt[:BLOCK]]) == [Rejected("format")]
    client.set(truncated, b"iskv1:" + bytes(32) + b"a block in the old, unkeyed format")
    assert redis_tier.get_many([b_keys[0]], [b_prompt[:BLOCK]]) == [Rejected("format")]


def _forge(
    tier: RedisTier, originals: dict[str, bytes], prompt_ids: list[int], seal: Callable[..., bytes]
) -> None:
    """What a client with write access to Redis can do knowing the format (magic, a 32-byte
    seal, safetensors; what the seal covers) but not the key: rewrite each block's keys and
    values (times -50) and seal them again, with `seal(full_key, token_ids, payload)`."""
    client = tier._connection()
    for i, (full, data) in enumerate(originals.items()):
        tensors = load_tensors(data[len(_MAGIC) + 32 :])
        forged = save_tensors({"k": tensors["k"] * -50, "v": tensors["v"] * -50})
        client.set(full, _MAGIC + seal(full, prompt_ids[i * BLOCK : (i + 1) * BLOCK], forged) + forged)


def test_a_block_resealed_by_a_forger_without_the_key_is_rejected_and_the_answer_is_a_cold_runs(
    registry: Registry, redis_tier: RedisTier
) -> None:
    a_prompt = prompt(21, 3 * BLOCK)
    plain = runtime_with(registry, None)
    try:
        cold = plain.submit(a_prompt, max_new_tokens=8).result(timeout=60).token_ids
    finally:
        plain.stop()
    writer = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=redis_tier))
    try:
        writer.submit(a_prompt, max_new_tokens=2).result(timeout=60)  # A's blocks go to Redis, sealed
    finally:
        writer.stop()
    client = redis_tier._connection()
    full_keys = [redis_tier.key_prefix + k for k in PrefixCache(block_tokens=BLOCK).keys(V1, a_prompt)]
    originals = {k: client.get(k) for k in full_keys}
    digest = registry.get(V1).sha256
    guesses = {
        "the old unkeyed seal": lambda full, ids, payload: hashlib.sha256(full.encode() + b"\0" + payload).digest(),
        "a guessed key": lambda full, ids, payload: _seal(b"infersight" * 4, full, digest, ids, payload),
        "the right key, other weights": lambda full, ids, payload: _seal(SECRET, full, "0" * 64, ids, payload),
    }  # fmt: skip
    for what, seal in guesses.items():
        _forge(redis_tier, originals, a_prompt, seal)
        replica = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=redis_tier))
        try:
            assert replica.submit(a_prompt, max_new_tokens=8).result(timeout=60).token_ids == cold, what
            stats = replica.prefix_cache_stats()[V1]
            assert stats.shared_rejected_seal == 1 and stats.shared_hits == 0 and stats.hits == 0, (
                what,
                stats,
            )
        finally:
            replica.stop()
    # the forgery is a real one: sealed with the key, the same blocks are served and change the answer
    _forge(
        redis_tier, originals, a_prompt, lambda full, ids, payload: _seal(SECRET, full, digest, ids, payload)
    )
    replica = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=redis_tier))
    try:
        assert replica.submit(a_prompt, max_new_tokens=8).result(timeout=60).token_ids != cold
        assert replica.prefix_cache_stats()[V1].shared_hits >= 1
    finally:
        replica.stop()


def test_the_shared_tier_refuses_to_start_without_a_long_enough_key(registry: Registry) -> None:
    for secret in (None, b"", "short", b"x" * 31):
        with pytest.raises(SealKeyInvalid, match="at least 32 bytes"):
            RedisTier(secret=secret, weights_digest=digest_of(registry))
    RedisTier(secret="y" * 32, weights_digest=digest_of(registry))  # a 32-byte key will do


def test_rejected_blocks_are_logged_once_a_minute_with_their_counts(
    registry: Registry, redis_tier: RedisTier, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    tier = RedisTier(key_prefix=redis_tier.key_prefix, timeout_s=2.0, secret=SECRET,
                     weights_digest=digest_of(registry), clock=lambda: now[0])  # fmt: skip
    ids = prompt(31, 2 * BLOCK)
    keys = PrefixCache(block_tokens=BLOCK).keys(V1, ids)
    spans = [ids[:BLOCK], ids[BLOCK:]]
    client = tier._connection()
    client.set(tier.key_prefix + keys[0], _MAGIC + b"\0" * 32 + b"forged")  # a seal that does not match
    client.set(tier.key_prefix + keys[1], b"not ours")
    with caplog.at_level(logging.WARNING, logger="infersight.engine.prefix_cache"):
        for _ in range(5):
            assert tier.get_many(keys, spans) == [Rejected("seal"), Rejected("format")]
            now[0] += 10.0
        assert len(caplog.records) == 1 and "seal: 1" in caplog.text and "format: 1" in caplog.text
        now[0] += 20.0  # past the minute since the first line: the next one counts what came since
        tier.get_many(keys, spans)
    assert len(caplog.records) == 2
    assert (
        "10 block(s)" in caplog.records[1].getMessage()
        and "format: 5, seal: 5" in caplog.records[1].getMessage()
    )
    assert SECRET.decode("latin-1") not in caplog.text


def test_redis_unreachable_falls_back_to_local_and_counts_the_failure(registry: Registry) -> None:
    dead = RedisTier(f"redis://127.0.0.1:{free_port()}/0", key_prefix="unused:", timeout_s=0.2, secret=SECRET,
                     weights_digest=digest_of(registry))  # fmt: skip
    rt = runtime_with(registry, PrefixCache(block_tokens=BLOCK, shared=dead))
    try:
        out = [rt.submit(chat(1), max_new_tokens=5).result(timeout=60).token_ids for _ in range(2)]
        assert out[0] == out[1] and len(out[0]) == 5
        stats = rt.prefix_cache_stats()[V1]
        assert stats.shared_failures >= 1 and stats.hits == len(chat(1)) // BLOCK  # second one: local hits
    finally:
        rt.stop()


def test_an_unreachable_redis_logs_one_warning_without_its_password(caplog: pytest.LogCaptureFixture) -> None:
    dead = RedisTier(f"redis://:s3cret@127.0.0.1:{free_port()}/0", key_prefix="unused:", timeout_s=0.2,
                     retry_s=0, secret=SECRET, weights_digest=lambda version: "0" * 64)  # fmt: skip
    cache = PrefixCache(block_tokens=BLOCK, shared=dead)
    with caplog.at_level(logging.INFO, logger="infersight.engine.prefix_cache"):
        for q in range(5):  # five lookups, each one trying Redis again (retry_s=0)
            keys = cache.keys(V1, chat(q))
            assert (
                cache.lookup(
                    V1, keys, tokens=[chat(q)[i * BLOCK : (i + 1) * BLOCK] for i in range(len(keys))]
                )
                == []
            )
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage(), caplog.text
    assert "s3cret" not in caplog.text
    assert cache.stats()[V1].shared_failures == 5


def test_the_most_frequent_block_prefixes_are_chosen_from_recorded_prompts() -> None:
    other = [50 + i for i in range(2 * BLOCK)]  # a second, rarer shared head of two blocks
    recorded = [chat(q) for q in range(6)] + [other + prompt(q, 4) for q in range(3)] + [prompt(90, 20)]
    got = frequent_prefixes(recorded, BLOCK, top=2)
    # the system prompt (5 blocks, 6 prompts) first, then the other head (2 blocks, 3 prompts):
    # not every block of them, and not the prompts seen once
    assert got == [SYSTEM, other]
    assert frequent_prefixes(recorded, BLOCK, top=0) == []
    # past those, a prompt seen once is its own prefix (its whole blocks; questions shorter
    # than a block add none)
    assert frequent_prefixes(recorded, BLOCK, top=50) == [SYSTEM, other, prompt(90, 20)[: 2 * BLOCK]]


def test_start_and_deploy_prefill_the_top_prefixes_of_recorded_prompts(registry: Registry) -> None:
    recorded = [chat(q) for q in range(8)]  # no whole prompt repeats; the system prompt does
    cache = PrefixCache(block_tokens=BLOCK, max_bytes=64 << 20)
    rt = runtime_with(registry, cache, preload_source=lambda v: recorded, preload_top=1)
    try:
        assert rt.prefix_cache_stats()[V1].blocks_held == len(SYSTEM) // BLOCK  # only the system prompt
        rt.submit(chat(42), max_new_tokens=1).result(timeout=60)
        assert rt.prefix_cache_stats()[V1].hits == len(SYSTEM) // BLOCK  # a new question starts warm
    finally:
        rt.stop()
