"""The service's prefix cache: frequent recorded prompts prefilled at deploy, counters on /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import auth, config
from fastapi.testclient import TestClient
from infersight.monitor.service import ConfigInvalid, EngineConfig, create_app, load_config


def test_frequent_recorded_prefixes_are_prefilled_at_deploy_and_counted_on_metrics(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("prefix")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=2, max_seq_len=256,
                                          max_prompt_tokens=128, max_tokens_limit=16, prefix_cache_mb=64,
                                          prefix_block_tokens=8, preload_prompts=2))  # fmt: skip
    system = "you are the assistant of a retail bank. answer in two short sentences. never ask for a pin. "
    questions = ["how do i top up my card", "what is the exchange rate today", "my card was declined",
                 "where is my transfer", "can i change my pin"]  # fmt: skip
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        service = app.state.service
        runtime = service.parts.backend.runtime
        answers = []
        for text in [*questions, questions[0]]:  # no whole prompt is frequent; the system prompt is
            r = client.post(
                "/v1/completions", json={"prompt": system + text, "max_tokens": 4, "temperature": 0}
            )
            assert r.status_code == 200, r.text
            answers.append(r.json()["choices"][0]["text"])
        assert answers[0] == answers[-1]  # the warm repeat answers as the cold one
        assert service.writer.flush()
        r = client.post("/api/v1/models/deploy", json={"version": BAD}, headers=auth())
        assert r.status_code == 200, r.text
        held = runtime.prefix_cache_stats()[BAD]
        system_blocks = len(runtime.tokenizer.encode(system, add_special_tokens=False).ids) // 8
        # read from the stored records and prefilled before BAD took any traffic: the shared
        # system prompt's blocks, as sent and as a chat (the two most frequent prefixes), and
        # none of the questions' blocks
        assert system_blocks >= 2 and held.hits == 0
        assert 2 * system_blocks - 1 <= held.blocks_held <= 2 * system_blocks + 1
        r = client.post(
            "/v1/completions", json={"prompt": system + "is there a fee for this", "max_tokens": 2}
        )
        assert r.status_code == 200
        first = runtime.prefix_cache_stats()[BAD]
        assert (
            first.hits == system_blocks and first.misses <= 1
        )  # its first request, a new question, was warm
        metrics = client.get("/metrics").text
        hits = f'infersight_prefix_cache_hits_total{{model="mixtral_banking",model_version="{BAD}",tier="memory"}}'
        assert f"{hits} {float(first.hits)}" in metrics
        assert f'model_version="{BAD}",tier="redis"}} 0.0' in metrics  # no Redis here: none from it
        assert (
            f'infersight_prefix_cache_shared_rejected_total{{model="mixtral_banking",model_version="{BAD}",reason="seal"}}'
            in metrics
        )
        assert f'infersight_prefix_cache_bytes{{model="mixtral_banking",model_version="{BAD}"}}' in metrics
        assert "infersight_prefix_cache_evictions_total" in metrics


@pytest.mark.parametrize(
    ("engine", "field"),
    [
        ("prefix_cache_mb: -1", "engine.prefix_cache_mb"),
        ("prefix_block_tokens: 0", "engine.prefix_block_tokens"),
        ("prefix_cache_redis_url: 'http://127.0.0.1:6379'", "engine.prefix_cache_redis_url"),
        ("prefix_cache_redis_url: 'redis://127.0.0.1:6379'", "engine.prefix_cache_redis_key"),  # no key
        (
            "prefix_cache_redis_url: 'redis://127.0.0.1:6379', prefix_cache_redis_key: short",
            "engine.prefix_cache_redis_key",
        ),
    ],
)
def test_a_bad_prefix_cache_setting_names_the_field(tmp_path: Path, engine: str, field: str) -> None:
    path = tmp_path / "infersight.yaml"
    path.write_text(f"engine: {{registry: m, {engine}}}\n")
    with pytest.raises(ConfigInvalid) as info:
        load_config(path, {})
    assert str(info.value).startswith(f"{path}: {field}")


def test_the_shared_tiers_seal_key_may_come_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "infersight.yaml"
    path.write_text("engine: {registry: m, prefix_cache_redis_url: 'redis://127.0.0.1:6379'}\n")
    cfg = load_config(path, {"INFERSIGHT_KV_KEY": "s" * 32})
    assert cfg.engine is not None and cfg.engine.prefix_cache_redis_key == "s" * 32
    assert "s" * 32 not in repr(cfg)  # a secret stays out of logged configs
    with pytest.raises(ConfigInvalid, match="at least 32 bytes"):
        load_config(path, {"INFERSIGHT_KV_KEY": "s" * 31})
