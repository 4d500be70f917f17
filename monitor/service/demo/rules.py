"""The demo's alert rules: the shipped quality rules with short timings, a latency SLO, and
one route to the local signed-webhook receiver."""

from __future__ import annotations

__all__ = ["demo_rules"]

_RULES = """\
# infersight demo rules: short intervals so the incident plays out in minutes.
groups:
  - name: quality
    interval: 1s
    rules:
      - alert: PromptDrift
        signal: {kind: drift_p_value, field: prompt}
        op: "<"
        threshold: 0.01
        by: [model, model_version]
        keep_firing_for: 2s
        labels: {severity: warning, team: ml-quality}
        annotations:
          summary: "prompts to {{ $labels.model_version }} drifted from the reference (p = {{ $value | printf \\"%.2g\\" }})"
        actions:
          - {type: snapshot, requests: 50, cooldown: 1h}
slos:
  # generous on purpose (the demo's story is drift and a bad release, not latency): it shows
  # the error budget and burn rate on the page and in Grafana without paging
  - {name: answers-within-30s, objective: 0.99, threshold_ms: 30000, window: 30d}
receivers:
  - name: demo-hook
    webhook: {url: "HOOK_URL", secret: "HOOK_SECRET"}
route:
  receiver: demo-hook
  group_by: [alertname, model_version]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
"""


def demo_rules(hook_url: str, secret: str) -> str:
    return _RULES.replace("HOOK_URL", hook_url).replace("HOOK_SECRET", secret)
