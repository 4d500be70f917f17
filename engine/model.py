"""MoEModel: a loaded Mixtral network and the calls a user or the serving runtime makes on it.

`logits` is the exact full forward; `generate` is greedy or sampled decoding for a batch of
equal-length prompts. The serving hooks (`new_cache`, `prefill`, `decode`) are what
`generate` itself runs on: one pre-allocated KV cache with a slot per running sequence,
each row of a decode step at its own position.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .config import ModelConfig
from .errors import CacheCapacityExceeded, InvalidInput
from .native_step import NativeStep
from .network import AttentionStep, KVCache, Transformer
from .paths import EnginePath, cpu_model
from .requests import check_sampling, sample

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["MoEModel"]


class MoEModel:
    def __init__(
        self,
        network: Transformer,
        config: ModelConfig,
        *,
        tokenizer: Tokenizer | None,
        quantize: str | None,
        device: torch.device,
        dtype: torch.dtype,
        path: Path | None = None,
        engine_path: EnginePath | None = None,
        native_step: NativeStep | None = None,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.network = network
        self.config = config
        self.tokenizer = tokenizer
        self.quantize = quantize
        self.device = device
        self.dtype = dtype  # activation dtype (bf16 for int8 on CPU, the int8 kernels want it)
        self.path = path
        # the decode path chosen at load (paths.py); a model built by hand runs the eager one
        self.engine_path = engine_path or EnginePath("eager", cpu_model(), "not applicable", 0.0)
        self.native_step = native_step  # the native path's decode step in one C call (native_step.py)
        # tokenizer_config.json's Jinja chat template (the serving layer renders it) and the
        # special tokens it may name (bos_token, eos_token, ...); None: prompted as plain lines
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    def __repr__(self) -> str:
        c = self.config
        return (
            f"MoEModel(layers={c.num_hidden_layers}, hidden={c.hidden_size}, experts={c.num_local_experts}"
            f"/top-{c.num_experts_per_tok}, vocab={c.vocab_size}, dtype={self.dtype}, "
            f"quantize={self.quantize}, device={self.device})"
        )

    # ---- full forward ------------------------------------------------------------------
    @torch.inference_mode()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, T] -> fp32 logits [B, T, V] at every position; no cache."""
        ids = self._token_ids(input_ids, ndim=2)
        T = ids.shape[1]
        positions = torch.arange(T, device=self.device).expand_as(ids)
        step = AttentionStep(mask=self._window_mask(T))
        return self.network(ids, positions, step, span=T, last_only=False)

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> torch.Tensor:
        """input_ids [B, T] -> the next `max_new_tokens` tokens of each row [B, N]; no early stop."""
        check_sampling(temperature, top_p)
        ids = self._token_ids(input_ids, ndim=2)
        B, T = ids.shape
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InvalidInput(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        out = torch.empty((B, max_new_tokens), dtype=torch.long, device=self.device)
        if max_new_tokens == 0:
            return out
        generator = None
        if seed is not None and temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        cache = self.new_cache(B, T + max_new_tokens - 1)
        rows = slice(0, B)
        slots = torch.arange(B, device=self.device)
        token = sample(
            self._prefill(cache, rows, ids), temperature=temperature, top_p=top_p, generator=generator
        )
        out[:, 0] = token
        for i in range(1, max_new_tokens):
            position = T + i - 1  # the position of the token being fed
            positions = torch.full((B,), position, dtype=torch.long, device=self.device)
            logits = self._decode(cache, slots, rows, token, positions, kv_len=position + 1, uniform=True)
            token = sample(logits, temperature=temperature, top_p=top_p, generator=generator)
            out[:, i] = token
        return out

    # ---- serving hooks -------------------------------------------------------------------
    def new_cache(self, max_batch: int, max_seq_len: int) -> KVCache:
        """A KV cache for `max_batch` concurrent sequences of up to `max_seq_len` tokens each."""
        for name, value in (("max_batch", max_batch), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"{name} must be an integer >= 1, got {value!r}")
        c = self.config
        return KVCache.allocate(
            layers=c.num_hidden_layers,
            max_batch=max_batch,
            kv_heads=c.num_key_value_heads,
            max_seq_len=max_seq_len,
            head_dim=c.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.inference_mode()
    def prefill(self, cache: KVCache, slot: int, input_ids: torch.Tensor) -> torch.Tensor:
        """Run prompt [T] into cache slot `slot` (positions 0..T-1) -> fp32 logits [V] of its last token."""
        ids = self._token_ids(input_ids, ndim=1)
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < cache.max_batch:
            raise CacheCapacityExceeded(f"slot {slot!r} is not in [0, {cache.max_batch})")
        if ids.shape[0] > cache.max_seq_len:
            raise CacheCapacityExceeded(
                f"prompt of {ids.shape[0]} tokens does not fit a cache of {cache.max_seq_len} positions"
            )
        return self._prefill(cache, slice(slot, slot + 1), ids[None])[0]

    @torch.inference_mode()
    def decode(
        self, cache: KVCache, slots: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """One token per row: input_ids[b] sits at positions[b] of cache slot slots[b] -> fp32 logits [B, V].

        Row b attends to positions 0..positions[b] of its own slot only. Slots must be distinct.
        On CPU the attended length is read from `positions` (free there); on an accelerator the
        whole cache length is attended under the mask, so the step never waits on the device.
        """
        ids = self._token_ids(input_ids, ndim=1, check_range=False)
        slots = torch.as_tensor(slots, device=self.device, dtype=torch.long)
        positions = torch.as_tensor(positions, device=self.device, dtype=torch.long)
        if slots.shape != ids.shape or positions.shape != ids.shape:
            raise InvalidInput(
                f"slots {list(slots.shape)}, input_ids {list(ids.shape)} and positions "
                f"{list(positions.shape)} must all be [B]"
            )
        kv_len = cache.max_seq_len  # an accelerator attends the whole cache under the mask
        if self.native_step is None and self.device.type == "cpu":  # the C step checks them itself
            top = int(positions.max())
            if top >= cache.max_seq_len or int(positions.min()) < 0:
                raise CacheCapacityExceeded(
                    f"positions must lie in [0, {cache.max_seq_len}), got up to {top}"
                )
            if int(slots.min()) < 0 or int(slots.max()) >= cache.max_batch:
                raise CacheCapacityExceeded(f"slots must lie in [0, {cache.max_batch})")
            kv_len = top + 1
        return self._decode(cache, slots, None, ids, positions, kv_len=kv_len, uniform=False)

    @torch.inference_mode()
    def prefill_blocks(
        self, cache: KVCache, slot: int, input_ids: torch.Tensor, *, start: int, block: int
    ) -> torch.Tensor:
        """Block prefill: prompt [T] into slot `slot`, whose positions 0..start-1 already hold
        the prompt's keys and values; the rest runs in chunks of `block` tokens that begin at
        multiples of `block` -> fp32 logits [V] of the last token.

        Every chunk is computed the same way whether the positions before it were computed
        just now or copied from a prefix cache, so the logits do not depend on `start` (a
        multiple of `block`, < T): this is what makes the prefix cache exact.
        """
        ids = self._token_ids(input_ids, ndim=1)
        T = ids.shape[0]
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < cache.max_batch:
            raise CacheCapacityExceeded(f"slot {slot!r} is not in [0, {cache.max_batch})")
        if cache.max_seq_len < T:
            raise CacheCapacityExceeded(
                f"prompt of {T} tokens does not fit a cache of {cache.max_seq_len} positions"
            )
        if block < 1 or start % block or not 0 <= start < T:
            raise InvalidInput(f"start must be a multiple of block={block} in [0, {T}), got {start}")
        rows = slice(slot, slot + 1)
        logits = None
        native = self.native_step
        for offset in range(start, T, block):
            chunk = ids[offset : offset + block][None]  # [1, t]
            t = chunk.shape[1]
            if native is not None and native.prefills(t):
                # the C step over the chunk's tokens as rows of the slot, attending to the
                # positions before them through the cache (the eager forward would rebuild
                # every quantized weight per chunk); split the same way whatever `start` is
                logits = native.prefill_rows(cache, slot, ids, offset, offset + t)[None]
                continue
            positions = torch.arange(offset, offset + t, device=self.device)[None]
            step = AttentionStep(cache=cache, rows=rows, offset=offset, mask=self._chunk_mask(offset, t))
            logits = self.network(chunk, positions, step, span=offset + t, last_only=True)
        assert logits is not None
        return logits[0]

    def read_kv(self, cache: KVCache, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of slot `slot`'s keys and values at positions start..end-1: each [layers, kv_heads, end-start, hd]."""
        return cache.k[:, slot, :, start:end].clone(), cache.v[:, slot, :, start:end].clone()

    def write_kv(self, cache: KVCache, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put keys and values [layers, kv_heads, n, hd] (from `read_kv`) at positions start.. of slot `slot`."""
        n = k.shape[2]
        cache.k[:, slot, :, start : start + n] = k
        cache.v[:, slot, :, start : start + n] = v

    def _chunk_mask(self, offset: int, t: int) -> torch.Tensor:
        """Additive [1, 1, t, offset+t]: query i (at offset+i) sees keys 0..offset+i, within the window."""
        queries = torch.arange(offset, offset + t, device=self.device)[:, None]
        keys = torch.arange(offset + t, device=self.device)[None, :]
        allowed = keys <= queries
        window = self.config.sliding_window
        if window is not None:
            allowed &= keys > queries - window
        return self._additive(allowed[None, None])

    # ---- machinery shared by generate and the hooks ---------------------------------------
    def _prefill(self, cache: KVCache, rows: slice, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        if self.native_step is not None and self.native_step.prefills(T):  # rows of one slot (native_step.py)
            start = rows.start or 0
            return torch.stack([self.native_step.prefill(cache, start + r, ids[r]) for r in range(B)])
        positions = torch.arange(T, device=self.device).expand(B, T)
        step = AttentionStep(cache=cache, rows=rows, mask=self._window_mask(T))
        return self.network(ids, positions, step, span=T, last_only=True)  # [B, V]

    def _decode(
        self,
        cache: KVCache,
        slots: torch.Tensor,
        rows: slice | None,
        ids: torch.Tensor,
        positions: torch.Tensor,
        *,
        kv_len: int,
        uniform: bool,
    ) -> torch.Tensor:
        if self.native_step is not None:  # masks by each row's position (and the window) itself
            return self.native_step(cache, slots, ids, positions)
        window = self.config.sliding_window
        mask = None
        if not uniform or (window is not None and kv_len > window):
            keys = torch.arange(kv_len, device=self.device)
            allowed = keys[None, :] <= positions[:, None]  # [B, L]: each row sees its own prefix
            if window is not None:
                allowed &= keys[None, :] > positions[:, None] - window
            mask = self._additive(allowed[:, None, None, :])
        step = AttentionStep(
            cache=cache,
            rows=rows,
            slots=slots,
            positions=positions,
            write_at=kv_len - 1 if uniform else None,  # generate: every row at the same position
            kv_len=kv_len,
            mask=mask,
        )
        return self.network(ids[:, None], positions[:, None], step, span=kv_len, last_only=True)  # [B, V]

    def _window_mask(self, T: int) -> torch.Tensor | None:
        """None (plain causal) unless a sliding window cuts into T tokens."""
        window = self.config.sliding_window
        if window is None or window >= T:
            return None
        i = torch.arange(T, device=self.device)
        offset = i[:, None] - i[None, :]  # query - key
        return self._additive(((offset >= 0) & (offset < window))[None, None])

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        # an additive float mask: SDPA on CPU runs several times faster with it than with a bool mask
        zeros = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return zeros.masked_fill(~allowed, float("-inf"))

    def _token_ids(self, input_ids: torch.Tensor, *, ndim: int, check_range: bool = True) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor):
            raise InvalidInput(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise InvalidInput(f"input_ids must hold integer token ids, got {input_ids.dtype}")
        if input_ids.dim() != ndim or input_ids.numel() == 0:
            want = "[B, T]" if ndim == 2 else "[T]" if check_range else "[B]"
            raise InvalidInput(
                f"input_ids must be a non-empty {want} tensor, got shape {list(input_ids.shape)}"
            )
        ids = input_ids.to(device=self.device, dtype=torch.long)
        if check_range:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.config.vocab_size:
                raise InvalidInput(
                    f"token ids must lie in [0, {self.config.vocab_size}), got [{low}, {high}]"
                )
        return ids
