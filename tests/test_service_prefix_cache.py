"""The service's prefix cache: frequent recorded prompts prefilled at deploy, counters on /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import auth, config
from fastapi.testclient import TestClient
from infersight.monitor.service import ConfigInvalid, EngineConfig, create_app, load_config


def test_frequent_recorded_prompts_are_prefilled_at_deploy_and_counted_on_metrics(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("prefix")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=2, max_seq_len=256,
                                          max_prompt_tokens=128, max_tokens_limit=16, prefix_cache_mb=64, prefix_block_tokens=4,
                                          preload_prompts=1))  # fmt: skip
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        service = app.state.service
        runtime = service.components["backend"].runtime
        frequent, rare = "how do i top up my card please", "what is the exchange rate today"
        answers = []
        for text in (frequent, frequent, rare, frequent):
            r = client.post("/v1/completions", json={"prompt": text, "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            answers.append(r.json()["choices"][0]["text"])
        assert answers[0] == answers[1] == answers[3]  # the warm repeats answer as the cold one
        assert service.writer.flush()
        r = client.post("/api/v1/models/deploy", json={"version": BAD}, headers=auth())
        assert r.status_code == 200, r.text
        held = runtime.prefix_cache_stats()[BAD]
        assert held.blocks_held > 0 and held.hits == 0  # prefilled before BAD took any traffic
        r = client.post("/v1/completions", json={"prompt": frequent, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
        assert runtime.prefix_cache_stats()[BAD].hits > 0  # its first request found its prefix
        assert runtime.prefix_cache_stats()[BAD].misses == 0
        metrics = client.get("/metrics").text
        assert f'infersight_prefix_cache_hits_total{{model="mixtral_banking",version="{GOOD}"}}' in metrics
        assert f'infersight_prefix_cache_bytes{{model="mixtral_banking",version="{BAD}"}}' in metrics
        assert "infersight_prefix_cache_evictions_total" in metrics


@pytest.mark.parametrize(
    ("engine", "field"),
    [
        ("prefix_cache_mb: -1", "engine.prefix_cache_mb"),
        ("prefix_block_tokens: 0", "engine.prefix_block_tokens"),
        ("prefix_cache_redis_url: 'http://127.0.0.1:6379'", "engine.prefix_cache_redis_url"),
    ],
)
def test_a_bad_prefix_cache_setting_names_the_field(tmp_path: Path, engine: str, field: str) -> None:
    path = tmp_path / "infersight.yaml"
    path.write_text(f"engine: {{registry: m, {engine}}}\n")
    with pytest.raises(ConfigInvalid) as info:
        load_config(path, {})
    assert str(info.value).startswith(f"{path}: {field}")
