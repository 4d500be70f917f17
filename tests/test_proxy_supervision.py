"""Sidecar (proxy) mode watches the inference server, not itself: `supervise_pid` /
`--supervise-pid` points the process collector at the server's process, and the upstream's
own queue depth (vLLM `vllm:num_requests_waiting`, TGI `tgi_queue_size`) is read from its
Prometheus metrics, so the shipped `GPUUnderusedWhileQueued` rule can fire beside vLLM.

Stand-ins, for external boundaries only: a local HTTP server plays vLLM (its /metrics
text in vLLM's exposition, its OpenAI answers), and the GPU is `FakeNVML` at the pynvml
boundary. The rule is the shipped one with its `for` shortened from 10m to 1s."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from _service_support import auth, config, running, wait_for
from infersight.collectors.fake_nvml import FakeDevice, FakeNVML
from infersight.monitor.service import UpstreamConfig
from infersight.monitor.service.backend_proxy import queue_depths
from infersight.monitor.service.config import AlertingConfig, ScheduleConfig

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class VLLMStandIn:
    """A real HTTP server on loopback answering as vLLM's OpenAI server does: /metrics in
    its Prometheus text (`waiting` requests queued, two engines as vLLM V1 reports them),
    /v1/chat/completions with a short answer."""

    def __init__(self) -> None:
        self.waiting = 0
        self.metrics_status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    return self._send(404, b"not found", "text/plain")
                half = outer.waiting // 2
                text = (
                    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 4.0\n'
                    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} {half}.0\n'
                    f'vllm:num_requests_waiting{{engine="1",model_name="{MODEL}"}} {outer.waiting - half}.0\n'
                )
                self._send(outer.metrics_status, text.encode(), "text/plain; version=0.0.4")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if body.get("model") != MODEL:
                    return self._send(
                        404, b'{"object":"error","message":"no such model"}', "application/json"
                    )
                answer = {"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": "top up in the app"}}],
                          "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}}  # fmt: skip
                self._send(200, json.dumps(answer).encode(), "application/json")

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def vllm() -> Iterator[VLLMStandIn]:
    server = VLLMStandIn()
    yield server
    server.close()


@pytest.fixture
def server_process() -> Iterator[subprocess.Popen[bytes]]:
    """The inference server's process, as the sidecar sees it: another pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child
    child.kill()
    child.wait(timeout=10)


def shipped_underused_rule(tmp_path: Path) -> Path:
    shipped = yaml.safe_load(resources.files("infersight.alerts").joinpath("default_rules.yaml").read_text())
    [rule] = [r for g in shipped["groups"] for r in g["rules"] if r["alert"] == "GPUUnderusedWhileQueued"]
    assert rule["while"][0]["signal"]["kind"] == "queue_depth" and rule["threshold"] == 0.7
    path = tmp_path / "rules.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "gpu", "interval": "200ms", "rules": [{**rule, "for": "1s"}]}]})
    )
    return path


def _metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and line.split("}")[0][len(name) + 1 :] == want:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_gpu_underused_while_vllm_queues_fires_beside_a_vllm_stand_in(
    tmp_path: Path, vllm: VLLMStandIn, server_process: subprocess.Popen[bytes]
) -> None:
    nvml = FakeNVML([FakeDevice(sm_activity_pct=20.0)])  # GPU stand-in: SMs 20% busy
    cfg = config(
        tmp_path,
        upstream=UpstreamConfig(url=vllm.url),
        supervise_pid=server_process.pid,
        alerting=AlertingConfig(rules=shipped_underused_rule(tmp_path)),
        schedule=ScheduleConfig(sample_s=0.2, upstream_metrics_s=0.2, rules_s=0.2, timeseries_s=1.0),
    )
    with running(cfg, nvml=nvml) as (_app, client):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "how do I top up?"}]}
        assert client.post("/v1/chat/completions", json=chat, headers=auth()).status_code == 200
        time.sleep(1.5)  # SMs idle but nothing queued upstream: not an underused GPU, no alert
        assert client.get("/api/v1/alerts").json()["alerts"] == []
        vllm.waiting = 7
        labels = {"model": MODEL, "model_version": MODEL}
        wait_for(
            lambda: _metric(client.get("/metrics").text, "gen_ai_server_requests_waiting", **labels) == 7.0
        )
        firing = wait_for(lambda: [a for a in client.get("/api/v1/alerts?state=firing").json()["alerts"]
                                   if a["alertname"] == "GPUUnderusedWhileQueued"])  # fmt: skip
        assert firing[0]["labels"]["gpu"] == "0" and firing[0]["value"] == pytest.approx(0.2)
        # the process collector reads the server's process, not the sidecar's own
        text = client.get("/metrics").text
        assert _metric(text, "infersight_process_resident_memory_bytes", pid=str(server_process.pid))
        assert f'infersight_process_threads{{pid="{server_process.pid}"}}' in text
        # the queue drains: the depth follows; a metrics page that fails reads as no queue, counted
        vllm.waiting = 0
        wait_for(
            lambda: _metric(client.get("/metrics").text, "gen_ai_server_requests_waiting", **labels) == 0.0
        )
        vllm.waiting, vllm.metrics_status = 5, 500
        wait_for(lambda: _metric(client.get("/metrics").text, "infersight_upstream_metrics_errors_total",
                                 reason="http_status"))  # fmt: skip
        assert _metric(client.get("/metrics").text, "gen_ai_server_requests_waiting", **labels) == 0.0


def test_queue_depth_is_read_from_vllm_and_tgi_metrics_text() -> None:
    vllm = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="a"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="a"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="b"} 0.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 9.0\n'
    )
    assert queue_depths(vllm) == {"a": 5, "b": 0}
    tgi = "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\ntgi_queue_size 4\n"
    assert queue_depths(tgi) == {None: 4}
    assert queue_depths("# llama.cpp without --metrics serves nothing of these\n") == {}
    with pytest.raises(ValueError):
        queue_depths("<html>not metrics</html>\n")


def test_supervise_pid_comes_from_the_flag_and_a_missing_process_is_a_config_error(
    tmp_path: Path, vllm: VLLMStandIn
) -> None:
    import argparse

    from infersight.monitor.cli import _serve
    from infersight.monitor.service import ConfigInvalid, Service, load_config

    parser = argparse.ArgumentParser()
    _serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--upstream", vllm.url, "--supervise-pid", "4242"])
    assert _serve.build_config(args, {}).supervise_pid == 4242
    path = tmp_path / "infersight.yaml"
    path.write_text("supervise_pid: 0\n")
    with pytest.raises(ConfigInvalid, match="supervise_pid"):
        load_config(path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    service = Service(config(tmp_path, upstream=UpstreamConfig(url=vllm.url), supervise_pid=gone.pid))
    with pytest.raises(ConfigInvalid, match=f"supervise_pid.*{gone.pid}"):
        service.start()
    service.stop()
