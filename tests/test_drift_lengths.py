"""Request-length drift (monitor/drift/_lengths.py): long texts appearing are flagged, null
windows stay calibrated conditional on the one reference kept, and odd windows get notes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from infersight.monitor.cli import main
from infersight.monitor.data import banking77
from infersight.monitor.drift import RequestLengths, length_drift, read_lengths

ALPHA = 0.05


def _prompts(rng: np.random.Generator, n: int) -> np.ndarray:
    # prompt tokens of a chat service: a system prompt plus a heavy-tailed question
    return 40 + np.round(rng.lognormal(3.0, 0.6, n)).astype(np.int64)


def _outputs(rng: np.random.Generator, n: int) -> np.ndarray:
    # output tokens, capped by max_tokens (many ties at the cap)
    return np.minimum(64, np.round(rng.gamma(2.0, 12.0, n))).astype(np.int64)


def _window(rng: np.random.Generator, n: int) -> RequestLengths:
    return RequestLengths(_prompts(rng, n), _outputs(rng, n))


def test_length_drift_flags_long_prompts_appearing_and_names_the_tail_test() -> None:
    rng = np.random.default_rng(11)
    detected, deciders = 0, set()
    for _ in range(40):
        reference = _window(rng, 1000)
        prompts = _prompts(rng, 300)
        prompts[:15] = rng.integers(600, 2000, 15)  # 5% of the window: pasted documents
        result = length_drift(reference, RequestLengths(prompts, _outputs(rng, 300)), alpha=ALPHA)
        detected += result.drifted
        if result.drifted:
            deciders.add(result.decided_by)
    assert detected >= 38, detected
    assert deciders == {"prompt length_tail"}


def test_length_drift_flags_outputs_getting_shorter() -> None:
    rng = np.random.default_rng(12)
    reference = _window(rng, 1000)
    outputs = np.minimum(64, np.round(rng.gamma(2.0, 6.0, 300))).astype(np.int64)  # answers halved
    result = length_drift(reference, RequestLengths(_prompts(rng, 300), outputs), alpha=ALPHA)
    assert result.drifted
    assert result.decided_by == "output length_ks"
    test = result.test("output", "length_ks")
    assert test is not None and test.p_adjusted < ALPHA and test.score > 0


def test_false_alarms_stay_under_alpha_conditional_on_each_reference() -> None:
    """20 references x 100 null windows: the rate per reference, not only on average."""
    rng = np.random.default_rng(13)
    rates = []
    for _ in range(20):
        reference = _window(rng, 1000)
        alarms = sum(length_drift(reference, _window(rng, 300), alpha=ALPHA).drifted for _ in range(100))
        rates.append(alarms / 100)
    assert np.quantile(rates, 0.9) <= ALPHA, rates
    assert max(rates) <= 2 * ALPHA, rates


def test_an_unlucky_reference_with_a_short_tail_does_not_page_every_window() -> None:
    """The reference whose 99th percentile is the lowest of 200 drawn: a marginally exact
    tail test (null share = the nominal 1%) would alarm often on it; the bounded one does not."""
    rng = np.random.default_rng(14)
    candidates = [_window(rng, 1000) for _ in range(200)]
    unlucky = min(candidates, key=lambda w: np.quantile(w.prompt_tokens, 0.99))
    alarms = sum(length_drift(unlucky, _window(rng, 300), alpha=ALPHA).drifted for _ in range(200))
    assert alarms / 200 <= 2 * ALPHA, alarms


def test_identical_reference_lengths_and_a_window_of_one_length_get_a_verdict_with_a_note() -> None:
    same = RequestLengths(np.full(200, 12), np.full(200, 32))
    result = length_drift(same, RequestLengths(np.full(50, 12), np.full(50, 32)))
    assert not result.drifted and result.p_value == pytest.approx(1.0)
    assert any("every reference prompt has 12" in n for n in result.notes)
    longer = length_drift(same, RequestLengths(np.full(50, 13), np.full(50, 32)))
    assert longer.drifted and longer.decided_by is not None and longer.decided_by.startswith("prompt")


def test_too_few_counts_or_different_counting_is_not_tested_and_says_why() -> None:
    rng = np.random.default_rng(15)
    few = length_drift(_window(rng, 1000), RequestLengths(_prompts(rng, 3), np.zeros(0, np.int64)))
    assert not few.drifted and few.tests == () and few.p_value == 1.0
    assert any("prompt lengths not tested" in n for n in few.notes)
    words = RequestLengths.of_texts(["a b c"] * 50)
    mixed = length_drift(_window(rng, 1000), words)
    assert mixed.tests == () and any("not compared" in n for n in mixed.notes)
    with pytest.raises(ValueError, match="alpha"):
        length_drift(words, words, alpha=1.5)


def test_recorded_token_counts_are_read_from_the_file_else_words_are_counted(tmp_path: Path) -> None:
    with_counts = tmp_path / "counted.jsonl"
    with_counts.write_text(
        "".join(
            json.dumps(
                {"prompt": f"question {i}", "response": "answer", "prompt_tokens": 30 + i, "output_tokens": 7}
            )
            + "\n"
            for i in range(5)
        ),
        encoding="utf-8",
    )
    lengths = read_lengths(with_counts, [f"question {i}" for i in range(5)], ["answer"] * 5)
    assert lengths.counted_by == "tokens"
    assert (
        lengths.prompt_tokens.tolist() == [30, 31, 32, 33, 34] and lengths.output_tokens.tolist() == [7] * 5
    )
    plain = tmp_path / "plain.txt"
    plain.write_text("how do I top up?\nwhere is my card\n", encoding="utf-8")
    words = read_lengths(plain, ["how do I top up?", "where is my card"])
    assert words.counted_by == "words" and words.prompt_tokens.tolist() == [6, 4]


def test_cli_reports_long_prompts_in_its_own_section_of_json_and_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bank = [u.text for u in banking77("test")]
    ref = tmp_path / "reference.txt"
    ref.write_text("\n".join(bank[:200]) + "\n", encoding="utf-8")
    cur = tmp_path / "current.txt"
    long_texts = [" ".join(bank[300 + 20 * i : 320 + 20 * i]) for i in range(6)]  # 20 questions pasted as one
    cur.write_text("\n".join(bank[200:254] + long_texts) + "\n", encoding="utf-8")
    html = tmp_path / "report.html"
    rc = main(
        ["drift", str(ref), str(cur), "--json", "--no-progress", "--report", str(html), "--fail-on-drift"]
    )
    data = json.loads(capsys.readouterr().out)
    lengths = data["lengths"]
    assert lengths["drift"] is True and lengths["counted_by"] == "words"
    assert lengths["decided_by"] == "prompt length_tail"
    assert data["length_drift"] is True and rc == 1
    assert {(t["field"], t["test"]) for t in lengths["tests"]} == {
        ("prompt", "length_tail"),
        ("prompt", "length_ks"),
    }
    page = html.read_text(encoding="utf-8")
    assert "Request lengths" in page and "Length drift detected" in page
