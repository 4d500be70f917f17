"""A `tokenizers` tokenizer rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary (`tokens`, with `scores` and
`token_type`), the BPE `merges` and the special ids, and names the text splitting by a short
string (`tokenizer.ggml.pre`) whose regexes live in llama.cpp's C++ (llama-vocab.cpp). This
module writes those back as the tokenizer.json the engine reads, and the tokenizer_config.json
(special tokens, `chat_template`) the serving layer reads.

Two vocabulary models:

- `gpt2`: byte-level BPE. The merges are the file's, in order. The split regexes are
  llama.cpp's for that `pre` name: a vocabulary trained with digits split one by one
  (`smollm`, `starcoder`, ...) gets that split first, as llama.cpp and the model's own
  tokenizer.json do (transformers' GGUF reader skips it, so its ids differ on digits).
- `llama`: SentencePiece BPE with byte fallback (`<0x0A>` tokens). The file has scores, not
  merges; the merges are recovered from the scores the way transformers does it (every split
  of a token into two known pieces, best-scored merged token first).

Token type 3 (control) becomes a special added token and 4 (user-defined) a plain added one,
so both are matched whole in text (`<|im_start|>` is one id, never nine).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import GGUFMismatch, GGUFUnsupported

__all__ = ["GGUFTokenizer", "build_tokenizer"]

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the regexes llama.cpp splits with, applied in order (llama-vocab.cpp)
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt2": (_GPT2_SPLIT,),
    "gpt-2": (_GPT2_SPLIT,),
    "mpt": (_GPT2_SPLIT,),
    "olmo": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "starcoder": (r"\p{N}", _GPT2_SPLIT),
    "refact": (r"\p{N}", _GPT2_SPLIT),
    "codeshell": (r"\p{N}", _GPT2_SPLIT),
    "llama3": (_LLAMA3_SPLIT,),
    "llama-v3": (_LLAMA3_SPLIT,),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
}


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    """What the import writes: tokenizer.json, and tokenizer_config.json's fields."""

    tokenizer: Any  # tokenizers.Tokenizer
    config: dict[str, Any]  # tokenizer_config.json: special tokens, add_bos_token, chat_template
    end_of_turn_ids: tuple[int, ...]  # ids that end an answer besides EOS (<|im_end|>, <|eot_id|>)

    def write(self, directory: Path) -> None:
        self.tokenizer.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(json.dumps(self.config, indent=2) + "\n")


def build_tokenizer(path: str, meta: Mapping[str, Any], vocab_size: int) -> GGUFTokenizer:
    """The tokenizer described by `meta` (GGUF key -> value); `vocab_size` is the embedding's rows."""
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise GGUFUnsupported(path, "tokenizer.ggml.tokens", "is missing: the file has no vocabulary")
    if len(tokens) != vocab_size:
        raise GGUFMismatch(
            path, "tokenizer.ggml.tokens",
            f"{len(tokens)} tokens, but token_embd.weight has {vocab_size} rows",
        )  # fmt: skip
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFMismatch(
            path, "tokenizer.ggml.token_type", f"{len(types)} entries for {len(tokens)} tokens"
        )
    if model == "gpt2":
        tok = _byte_level(path, meta, tokens)
    elif model == "llama":
        tok = _sentencepiece(path, meta, tokens)
    else:
        raise GGUFUnsupported(
            path, "tokenizer.ggml.model", f"{model!r} is not implemented (only 'gpt2', 'llama')"
        )
    _add_tokens(tok, tokens, types)

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is None:
            return None
        if not isinstance(i, int) or not 0 <= i < len(tokens):
            raise GGUFMismatch(path, f"tokenizer.ggml.{key}", f"id {i!r} is not in [0, {len(tokens)})")
        return str(tokens[i])

    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))
    bos = token("bos_token_id")
    if add_bos and bos is not None:
        from tokenizers import processors

        bos_id = tokens.index(bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        config["chat_template"] = template
    eot = [meta.get("tokenizer.ggml.eot_token_id"), meta.get("tokenizer.ggml.eom_token_id")]
    return GGUFTokenizer(tok, config, tuple(int(i) for i in eot if isinstance(i, int)))


def _byte_level(path: str, meta: Mapping[str, Any], tokens: Sequence[str]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise GGUFUnsupported(path, "tokenizer.ggml.merges", "is missing: a gpt2 vocabulary needs its merges")
    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    splits = _PRE_SPLITS.get(pre)
    if splits is None:
        raise GGUFUnsupported(
            path,
            "tokenizer.ggml.pre",
            f"{pre!r} is not implemented (known: {', '.join(sorted(_PRE_SPLITS))})",
        )
    pairs = []
    for i, merge in enumerate(merges):
        left, sep, right = str(merge).partition(" ")
        if not sep:
            raise GGUFMismatch(path, "tokenizer.ggml.merges", f"entry {i} {merge!r} is not two tokens")
        pairs.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False, ignore_merges=False))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _sentencepiece(path: str, meta: Mapping[str, Any], tokens: Sequence[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise GGUFUnsupported(
            path, "tokenizer.ggml.scores", "a llama (SentencePiece) vocabulary needs one score a token"
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = meta.get("tokenizer.ggml.merges")
    if isinstance(merges, list):
        pairs = [(left, right) for left, _, right in (str(m).partition(" ") for m in merges)]
    else:
        pairs = _merges_from_scores(vocab, dict(zip(tokens, scores, strict=True)))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(
        models.BPE(
            vocab,
            pairs,
            unk_token=tokens[unk] if isinstance(unk, int) else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def _merges_from_scores(vocab: Mapping[str, int], scores: Mapping[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two known pieces, ordered by the merged token's score
    (highest first), then by the pieces' lengths: SentencePiece BPE applies merges that way."""
    found: list[tuple[float, int, int, int, int, str, str]] = []
    for merged, score in scores.items():
        local = []
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        for li, ri, left, right in sorted(local):
            found.append((-float(score), len(left), len(right), li, ri, left, right))
    found.sort(key=lambda m: (m[0], m[1], m[2]))
    return [(m[5], m[6]) for m in found]


def _add_tokens(tok: Any, tokens: Sequence[str], types: Sequence[int]) -> None:
    from tokenizers import AddedToken

    control = [
        AddedToken(t, normalized=False, special=True)
        for t, k in zip(tokens, types, strict=True)
        if k == CONTROL
    ]
    plain = [
        AddedToken(t, normalized=False, special=False)
        for t, k in zip(tokens, types, strict=True)
        if k == USER_DEFINED
    ]
    if control:
        tok.add_special_tokens(control)
    if plain:
        tok.add_tokens(plain)
