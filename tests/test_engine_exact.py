"""The engine in fp32 on CPU computes what transformers' MixtralForCausalLM computes.

Logits within 1e-4 max abs difference and identical greedy tokens, across top-k, expert
counts, GQA ratios, an explicit head_dim, a sliding window, tied embeddings, odd sizes
(the gather fallback) and the serving hooks (each decode row at its own position).

In fp32 on CPU `load` may choose either decode path (engine/paths.py): the eager one, with
experts and projections on oneDNN-blocked weights, or the native C kernels. The `expert_path`
cases force each: `blocked` (eager), `native`, and `stacked` (eager with oneDNN turned off,
as on a build without it), so the `_grouped_mm` and gather paths that bf16 and CUDA use are
held to the same reference too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from infersight.engine import load, loading
from infersight.engine import projection as projections
from infersight.engine.native import NativeProjection
from infersight.engine.network import ExpertLoop, GroupedExperts
from infersight.engine.projection import BlockedProjection, DenseProjection, HeadProjection

from tests._engine_checkpoints import greedy_reference, save_checkpoint

TOL = 1e-4


@pytest.fixture(params=["blocked", "native", "stacked"])
def expert_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on the eager path (oneDNN-blocked weights), on the native kernels, then
    on the eager path with oneDNN turned off: every `load` in the test is forced onto it."""
    forced = "native" if request.param == "native" else "eager"
    choose = loading.choose
    monkeypatch.setattr(
        loading, "choose", lambda config, **kw: choose(config, **(kw | {"requested": forced}))
    )
    if request.param == "stacked":
        monkeypatch.setattr(projections, "blockable", lambda weight: False)
    return str(request.param)


def _compare(
    tmp_path: Path, *, steps: int = 8, prompt_len: int = 7, seed: int = 0, **overrides: object
) -> None:
    ref = save_checkpoint(tmp_path, seed, **overrides)
    model = load(tmp_path, device="cpu")
    assert model.dtype == torch.float32
    ids = torch.randint(
        0, ref.config.vocab_size, (2, prompt_len), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        expected = ref(ids).logits
    got = model.logits(ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL
    assert torch.equal(model.generate(ids, steps), greedy_reference(ref, ids, steps))


@pytest.mark.parametrize(
    ("top_k", "experts", "heads", "kv_heads"),
    [(1, 4, 4, 4), (2, 4, 4, 2), (3, 8, 8, 2), (2, 3, 4, 1), (3, 5, 8, 8)],
    ids=["top1-e4-mha", "top2-e4-gqa2", "top3-e8-gqa4", "top2-e3-mqa", "top3-e5-mha8"],
)
def test_logits_and_greedy_tokens_match_transformers(
    tmp_path: Path, top_k: int, experts: int, heads: int, kv_heads: int, expert_path: str
) -> None:
    _compare(
        tmp_path,
        num_experts_per_tok=top_k,
        num_local_experts=experts,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        seed=top_k * 10 + experts,
    )


def test_greedy_tokens_match_transformers_generate(tmp_path: Path, expert_path: str) -> None:
    ref = save_checkpoint(tmp_path, 3, eos_token_id=None)
    model = load(tmp_path, device="cpu")
    ids = torch.randint(0, 96, (3, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mask = torch.ones_like(ids)  # explicit: transformers would read token 0 as padding
        expected = ref.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)[
            :, 5:
        ]
    assert torch.equal(model.generate(ids, 12), expected)


def test_explicit_head_dim_wider_than_hidden_over_heads_matches(tmp_path: Path, expert_path: str) -> None:
    _compare(tmp_path, head_dim=32, num_attention_heads=4, num_key_value_heads=2)


def test_sliding_window_shorter_than_the_sequence_matches(tmp_path: Path, expert_path: str) -> None:
    _compare(tmp_path, sliding_window=4, prompt_len=9, steps=6)


def test_tied_embeddings_match_and_use_the_embedding_values(tmp_path: Path, expert_path: str) -> None:
    _compare(tmp_path, tie_word_embeddings=True)
    net = load(tmp_path, device="cpu").network
    assert net.layers[0].moe.gate.dtype == torch.float32
    head = net.head
    if isinstance(head, HeadProjection):  # the eager path: a column-major copy of the embedding
        assert torch.equal(head.wt.t(), net.embeddings) and head.wt.is_contiguous()


def test_sizes_grouped_mm_cannot_take_fall_back_and_still_match(tmp_path: Path, expert_path: str) -> None:
    # intermediate 50 fp32 = 200-byte rows: not a multiple of 16, so _grouped_mm refuses them
    _compare(tmp_path, hidden_size=72, intermediate_size=50)
    model = load(tmp_path, device="cpu")
    moe = model.network.layers[0].moe
    if expert_path == "blocked":  # oneDNN takes any size
        assert isinstance(moe.batched, ExpertLoop) and model.engine_path.name == "eager"
        assert isinstance(moe.loop.pairs[0][0], BlockedProjection)
    elif expert_path == "native":  # so do the native kernels (masked tails)
        assert isinstance(moe.batched, ExpertLoop) and model.engine_path.name == "native"
        assert isinstance(moe.loop.pairs[0][0], NativeProjection)
    else:  # on CPU the host loop over the active experts, not a gather of each token's weights
        assert isinstance(moe.batched, ExpertLoop) and isinstance(moe.loop.pairs[0][0], DenseProjection)


def test_without_onednn_aligned_sizes_take_grouped_mm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(projections, "blockable", lambda weight: False)
    save_checkpoint(tmp_path, 1)
    experts = load(tmp_path, device="cpu", engine_path="eager").network.layers[0].moe.batched
    assert isinstance(experts, GroupedExperts) and experts.grouped


def test_decode_rows_at_their_own_positions_match_full_recompute(tmp_path: Path, expert_path: str) -> None:
    ref = save_checkpoint(tmp_path, 5)
    model = load(tmp_path, device="cpu")
    assert (model.native_step is not None) == (expert_path == "native")  # decode in one C call
    gen = torch.Generator().manual_seed(5)
    prompts = {3: torch.randint(0, 96, (6,), generator=gen), 0: torch.randint(0, 96, (2,), generator=gen)}
    prompts[5] = torch.randint(0, 96, (11,), generator=gen)
    cache = model.new_cache(max_batch=6, max_seq_len=32)
    seqs = {}
    for slot, prompt in prompts.items():
        last = model.prefill(cache, slot, prompt)
        with torch.no_grad():
            expected = ref(prompt[None]).logits[0, -1]
        assert (last - expected).abs().max().item() < TOL
        seqs[slot] = torch.cat([prompt, last.argmax()[None]])
    for _ in range(4):  # rows at positions 2, 6 and 11 and onwards, in a shuffled slot order
        slots = torch.tensor([5, 0, 3])
        tokens = torch.stack([seqs[int(s)][-1] for s in slots])
        positions = torch.tensor([len(seqs[int(s)]) - 1 for s in slots])
        logits = model.decode(cache, slots, tokens, positions)
        assert logits.shape == (3, 96)
        for row, slot in enumerate(slots.tolist()):
            with torch.no_grad():
                expected = ref(seqs[slot][None]).logits[0, -1]
            assert (logits[row] - expected).abs().max().item() < TOL
            seqs[slot] = torch.cat([seqs[slot], logits[row].argmax()[None]])


def test_more_rows_than_a_kernel_tile_under_a_sliding_window_match(tmp_path: Path, expert_path: str) -> None:
    # 11 rows: the native step's products run 8-row tiles and a remainder, its attention
    # drops the positions that slid out of the window (4) row by row
    ref = save_checkpoint(tmp_path, 8, sliding_window=4)
    model = load(tmp_path, device="cpu")
    gen = torch.Generator().manual_seed(8)
    seqs = [torch.randint(0, 96, (2 + i % 5,), generator=gen) for i in range(11)]
    cache = model.new_cache(max_batch=12, max_seq_len=16)
    for slot, seq in enumerate(seqs):  # prompt i in slot i + 1; slot 0 stays empty
        model.prefill(cache, slot + 1, seq[:-1])
    slots = torch.arange(11).flip(0) + 1  # rows in reverse slot order
    order = slots - 1
    logits = model.decode(
        cache,
        slots,
        torch.stack([seqs[i][-1] for i in order]),
        torch.tensor([len(seqs[i]) - 1 for i in order]),
    )
    with torch.no_grad():
        for row, i in enumerate(order.tolist()):
            expected = ref(seqs[i][None]).logits[0, -1]
            assert (logits[row] - expected).abs().max().item() < TOL


def test_reusing_a_slot_for_a_shorter_prompt_ignores_the_old_keys(tmp_path: Path, expert_path: str) -> None:
    ref = save_checkpoint(tmp_path, 6)
    model = load(tmp_path, device="cpu")
    cache = model.new_cache(max_batch=1, max_seq_len=16)
    model.prefill(cache, 0, torch.arange(12))  # a long earlier occupant of slot 0
    short = torch.tensor([5, 9, 1])
    model.prefill(cache, 0, short)
    logits = model.decode(cache, torch.tensor([0]), torch.tensor([7]), torch.tensor([3]))
    with torch.no_grad():
        expected = ref(torch.tensor([[5, 9, 1, 7]])).logits[0, -1]
    assert (logits[0] - expected).abs().max().item() < TOL


def test_a_long_prompt_matches_on_every_path(tmp_path: Path, expert_path: str) -> None:
    # 2 x 61 rows per product: the native kernel's 8-row chunks and a 5-row remainder
    _compare(tmp_path, prompt_len=61, steps=4, seed=9)
