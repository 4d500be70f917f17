"""Customer-service traffic for the demo: real utterances through the OpenAI endpoint."""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["TrafficResult", "send_chats"]

SYSTEM = "you are the assistant of an online bank. answer the customer's question."


@dataclass(frozen=True)
class TrafficResult:
    sent: int
    ok: int
    errors: tuple[str, ...]
    versions: frozenset[str]


def send_chats(
    base_url: str,
    utterances: Sequence[str],
    *,
    workers: int = 8,
    max_tokens: int = 16,
    stream_every: int = 4,
    users: Sequence[str] | None = None,
) -> TrafficResult:
    """One chat completion per utterance, `workers` at a time; every `stream_every`-th streamed;
    `users[i]` is the OpenAI `user` of the i-th (what keeps a user on one version in a canary)."""

    def one(i: int, text: str, client: httpx.Client) -> tuple[bool, str]:
        body: dict[str, Any] = {"model": None, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                "max_tokens": max_tokens, "temperature": 0.0}  # fmt: skip
        body.pop("model")
        if users is not None:
            body["user"] = users[i]
        try:
            if stream_every and i % stream_every == 0:
                with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    lines = [line for line in r.iter_lines() if line]
                    if r.status_code != 200 or not lines or lines[-1] != "data: [DONE]":
                        return False, f"stream {r.status_code}"
                    return True, ""
            r = client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                return False, f"{r.status_code} {r.text[:120]}"
            return True, str(r.json().get("model"))
        except httpx.HTTPError as exc:
            return False, type(exc).__name__

    versions: set[str] = set()
    errors: list[str] = []
    ok = 0
    with httpx.Client(base_url=base_url, timeout=60.0) as client, ThreadPoolExecutor(workers) as pool:
        for success, info in pool.map(lambda p: one(p[0], p[1], client), enumerate(utterances)):
            if success:
                ok += 1
                if info:
                    versions.add(info)
            else:
                errors.append(info)
    return TrafficResult(len(utterances), ok, tuple(errors[:5]), frozenset(versions))


def sample(texts: Sequence[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return rng.sample(list(texts), min(n, len(texts)))
