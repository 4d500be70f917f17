"""The release candidates the real-model release-check benchmarks build (benchmarks/_candidates.py):
the whole-row int4 rounding, the terse template, the run plan and the naming of the check that
fired."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _candidates as c

torch = pytest.importorskip("torch")

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_int4_row_rounds_each_row_to_sixteen_levels_between_its_min_and_max() -> None:
    w = torch.randn(6, 96, generator=torch.Generator().manual_seed(1))
    q = c._int4_row("model.layers.0.mlp.down_proj.weight", w)
    for row, qrow in zip(w, q, strict=True):
        assert len(torch.unique(qrow)) <= 16
        step = (row.max() - row.min()) / 15
        assert float((qrow - row).abs().max()) <= float(step) / 2 + 1e-6
        assert torch.isclose(qrow.min(), row.min()) and torch.isclose(qrow.max(), row.max())


def test_int4_row_leaves_the_embedding_as_it_is() -> None:
    w = torch.randn(4, 32)
    assert torch.equal(c._int4_row("model.embed_tokens.weight", w), w)


def test_the_terse_template_replaces_only_the_default_system_message() -> None:
    from infersight.monitor.service.chat_template import render_template

    default = c._default_system(SMOLLM2_TEMPLATE)
    assert default == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    terse = SMOLLM2_TEMPLATE.replace(default, c.TERSE_SYSTEM)
    plain = render_template(terse, [{"role": "user", "content": "hi"}], {})
    assert c.TERSE_SYSTEM in plain and default not in plain
    own = render_template(
        terse, [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}], {}
    )
    assert c.TERSE_SYSTEM not in own  # a chat's own system message still wins


def test_the_plan_runs_every_candidate_once_a_round_in_drawn_orders() -> None:
    built = c.Candidates(Path("unused"), c.FP32, dict(c.VERSIONS), c.DEFAULT_NOISE_SIGMA)
    plan, seeds = c.RealModel(built, c.CANDIDATES, runs=8, seed=3).plan()
    assert len(plan) == len(seeds) == 8 * len(c.CANDIDATES)
    rounds = [plan[i : i + len(c.CANDIDATES)] for i in range(0, len(plan), len(c.CANDIDATES))]
    assert all(sorted(name for name, _, _ in r) == sorted(c.CANDIDATES) for r in rounds)
    assert len({tuple(name for name, _, _ in r) for r in rounds}) > 1
    assert len(set(seeds)) == len(seeds)
    assert all(version == c.VERSIONS[name] for name, version, _ in plan)


@pytest.mark.parametrize(
    ("reason", "check"),
    [
        ("paired regression: relevance fell in 9 of 10 pairs (rose in 1), mean -0.20, p=0.001 (10 pairs)",
         "paired relevance"),
        ("paired regression: the two answers less alike than 0.6 in 8 of 10 pairs", "paired similarity"),
        ("paired regression: output shorter in 9 and longer in 1 of 10 pairs", "paired length"),
        ("paired regression: finish reasons differ in 5 of 10 pairs (50%)", "paired finish"),
        ("paired regression: decode steps slower than 1.5x in 9 of 10 pairs", "paired step time"),
        ("regression on output_length: canary 8 (n=20) vs stable 16 (n=20), always-valid p=0.001",
         "arms output_length"),
    ],
)  # fmt: skip
def test_the_check_that_fired_is_named_from_the_verdicts_reason(reason: str, check: str) -> None:
    assert c.first_check(reason) == check
