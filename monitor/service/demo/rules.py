"""The demo's alert rules: the shipped quality rules with short timings, and one route to
the local signed-webhook receiver."""

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
