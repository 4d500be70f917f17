"""Rule files: the default set loads; bad files are refused with file, line and reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from infersight.alerts import RuleParseError, load_config
from infersight.alerts.errors import InvalidMatcher
from infersight.alerts.notify.matchers import parse_matcher
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.rules import parse_duration, render

GOOD_RULE = """\
groups:
  - name: g
    rules:
      - alert: Slow
        signal: {kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 5m}
        op: ">"
        threshold: 2
        by: [model, model_version]
        for: 1m
"""


def test_default_rules_cover_the_failures_the_product_exists_for() -> None:
    config = load_config(env={})
    kinds = {r.condition.signal.kind for r in config.rules}
    assert {
        "latency_quantile",
        "gpu_sm_activity",
        "memory_slope",
        "drift_p_value",
        "relevance",
        "error_rate",
        "dead_letters",
    } <= kinds
    gpu = config.rule("GPUUnderusedWhileQueued")
    assert gpu.condition.threshold == 0.7 and gpu.while_[0].signal.kind == "queue_depth"
    for rule in config.rules:
        assert dict(rule.annotations).get("summary") and dict(rule.annotations).get("runbook_url")
        assert dict(rule.labels).get("severity") in ("warning", "critical")
    # a critical latency rule mutes its warning twin
    assert config.inhibit_rules and "alertname" in config.inhibit_rules[0].equal


def _refused(text: str, tmp_path: Path) -> RuleParseError:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RuleParseError) as info:
        load_config(path, env={})
    assert info.value.file == str(path)
    return info.value


@pytest.mark.parametrize(
    ("edit", "line", "reason"),
    [
        (
            ("latency_quantile", "latency_quantil"),
            5,
            "unknown signal kind 'latency_quantil'; valid kinds: latency_quantile",
        ),
        (("metric: request_duration", "metric: duration"), 5, "metric must be one of request_duration"),
        (("quantile: 0.99", "quantile: 1.5"), 5, "quantile must be in (0, 1)"),
        (("for: 1m", "for: soon"), 9, "not a duration: 'soon'"),
        (('op: ">"', 'op: "=>"'), 6, "op must be one of"),
        (("threshold: 2", "threshold: high"), 7, "threshold must be a finite number"),
        (("by: [model, model_version]", "by: [model, gpu]"), 8, "cannot be split by 'gpu'"),
        (("for: 1m", "for: 1m\n        severity: critical"), 10, "unknown key 'severity'"),
        (
            ("        op:", "        signal: {kind: relevance}\n        op:"),
            6,
            "duplicate key 'signal' (first at line 5)",
        ),
        (
            ("for: 1m", "for: 1m\n        annotations: {summary: '{{ $value | frobnicate }}'}"),
            10,
            "unknown template function",
        ),
        (("alert: Slow", "alert: 'slow down'"), 4, "must be letters, digits and _"),
        (("rules:\n", "rules:\n    - [\n"), 5, "invalid YAML"),
    ],
)
def test_bad_rule_file_is_refused_with_line_and_reason(
    edit: tuple[str, str], line: int, reason: str, tmp_path: Path
) -> None:
    err = _refused(GOOD_RULE.replace(*edit), tmp_path)
    assert err.line == line, err
    assert reason in err.reason, err
    assert str(err).startswith(f"{tmp_path / 'rules.yaml'}:{line}: ")


def test_route_to_an_undefined_receiver_is_refused(tmp_path: Path) -> None:
    err = _refused(
        GOOD_RULE + "receivers:\n  - name: a\n    slack: {url: 'http://x/'}\nroute: {receiver: b}\n", tmp_path
    )
    assert err.line == 13 and "unknown receiver 'b' (defined: a)" in err.reason


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://host:99999/", "invalid"),
        ("http://host:0/", "port must be in 1..65535"),
        ("http://host:http/", "invalid"),
        ("http:///hook", "has no host"),
    ],
)
def test_receiver_url_that_cannot_be_sent_to_is_refused_at_load(
    url: str, reason: str, tmp_path: Path
) -> None:
    text = GOOD_RULE + f"receivers:\n  - name: a\n    slack:\n      url: '{url}'\nroute: {{receiver: a}}\n"
    err = _refused(text, tmp_path)
    assert err.line == 13 and reason in err.reason, err
    assert "receiver 'a' (slack)" in err.reason


def test_receiver_url_from_the_environment_is_checked_at_load_too(tmp_path: Path) -> None:
    text = GOOD_RULE + "receivers:\n  - name: a\n    slack: {url_env: HOOK_URL}\nroute: {receiver: a}\n"
    with pytest.raises(RuleParseError, match=r":12: receiver 'a' \(slack\): url .*99999.* \(from url_env\)"):
        parse_config(text, env={"HOOK_URL": "http://127.0.0.1:99999/x"})
    assert parse_config(text, env={"HOOK_URL": "http://127.0.0.1:9/x"}).receivers["a"].url.endswith(":9/x")


def test_webhook_secret_must_be_standard_webhooks_form(tmp_path: Path) -> None:
    text = (
        GOOD_RULE
        + "receivers:\n  - name: a\n    webhook: {url: 'http://x/', secret: plain}\nroute: {receiver: a}\n"
    )
    assert "whsec_" in _refused(text, tmp_path).reason


def test_receiver_from_unset_environment_variable_is_disabled_not_fatal() -> None:
    text = (
        GOOD_RULE
        + "receivers:\n  - name: pd\n    pagerduty: {routing_key_env: PD_KEY}\nroute: {receiver: pd}\n"
    )
    off = parse_config(text, env={}).receivers["pd"]
    assert not off.enabled and "PD_KEY" in (off.disabled_reason or "")
    on = parse_config(text, env={"PD_KEY": "k" * 32}).receivers["pd"]
    assert on.enabled and on.secret == "k" * 32 and on.url.endswith("/v2/enqueue")


def test_unreadable_file_is_a_rule_parse_error(tmp_path: Path) -> None:
    with pytest.raises(RuleParseError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_annotation_templates_render_value_and_labels() -> None:
    labels = {"model_version": "mixtral_bank_int8-v1.2"}
    assert render("p99 of {{ $labels.model_version }} is {{ $value | humanizeDuration }}", labels, 2.5) == (
        "p99 of mixtral_bank_int8-v1.2 is 2.5s"
    )
    assert render("{{ $value | humanizePercentage }}", {}, 0.125) == "12.5%"
    assert render("{{ $value | humanize }}B", {}, 52428800) == "52.43MB"
    assert render('{{ $value | printf "%.2f" }}', {}, 0.3333) == "0.33"


def test_a_duration_with_a_trailing_newline_is_refused() -> None:
    # `$` in re.match also matches before a final newline; every check is a full match
    assert parse_duration("1h30m") == 5400
    for text in ("5m\n", "5m\nrm"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(text)


def test_matchers_follow_alertmanager_syntax() -> None:
    assert parse_matcher('severity="critical"').matches({"severity": "critical"})
    assert parse_matcher("alertname=~GPU.*").matches({"alertname": "GPUMemoryLeak"})
    assert not parse_matcher('alertname=~"GPU"').matches({"alertname": "GPUMemoryLeak"})  # anchored
    assert parse_matcher("team!=ml").matches({})
    with pytest.raises(InvalidMatcher):
        parse_matcher("no operator")
    with pytest.raises(InvalidMatcher):
        parse_matcher("a=~(")


def test_cli_check_lists_rules_and_refuses_a_bad_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infersight.monitor.cli import main

    assert main(["rules", "check"]) == 0
    assert "default_rules.yaml: 10 rules OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD_RULE.replace("for: 1m", "for: 1 minute"))
    assert main(["rules", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"infersight rules: error: {bad}:9: rule 'Slow'.for: not a duration"
    )


def test_a_pathological_silence_regex_matches_in_linear_time() -> None:
    # (a+)+b against "aaaa...c" backtracks exponentially in Python's re; RE2 answers at once
    matcher = parse_matcher('model_version=~"(a+)+b"')
    started = time.perf_counter()
    assert not matcher.matches({"model_version": "a" * 5000 + "c"})
    # backtracking would take longer than the universe's age: 10 s holds on any loaded machine
    assert time.perf_counter() - started < 10.0
