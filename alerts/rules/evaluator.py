"""The rule evaluator: reads signals, steps each alert's state, and in ONE transaction
writes the alerts, their history, the actions their firing asks for, and the
notifications the notifier decides to send (the outbox)."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from infersight.monitor.store.tables import action_runs
from sqlalchemy import Connection, Engine, insert, select

from ..lifecycle import (
    ActiveAlert,
    Transition,
    delete_alert,
    fingerprint,
    load_alerts,
    record_transitions,
    resolve_alert,
    save_alert,
    step,
)
from ..notify.routing import FlushResult, Notifier
from .config import AlertConfig
from .rules import ActionSpec, Condition, Rule, RuleGroup, render
from .signals import Sample, SignalSource

__all__ = ["EvaluationResult", "Evaluator", "action_run_key"]

Clock = Callable[[], float]


def action_run_key(action: ActionSpec, episode: str) -> str:
    """An action runs once per alert episode: this key is unique in `alert_action_runs`."""
    return f"{action.type}:{episode}"


@dataclass(frozen=True)
class EvaluationResult:
    at: dt.datetime
    rules_evaluated: int
    transitions: tuple[Transition, ...]
    actions_queued: tuple[str, ...]  # run keys
    flushes: tuple[FlushResult, ...]
    errors: tuple[tuple[str, str], ...]  # (rule key, why its signal could not be read)

    @property
    def notifications(self) -> tuple[int, ...]:
        return tuple(f.outbox_id for f in self.flushes if f.outbox_id is not None)


def _guard_holds(guard: Condition, signals: SignalSource) -> bool:
    return any(not math.isnan(s.value) and guard.holds(s.value) for s in signals.read(guard.signal, ()))


class Evaluator:
    """Evaluates each rule group at its own interval when `tick()` is called (call it
    about once a second from a scheduler; `evaluate()` runs every group at once)."""

    def __init__(
        self,
        engine: Engine,
        config: AlertConfig,
        signals: SignalSource,
        *,
        clock: Clock = time.time,
        notifier: Notifier | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.signals = signals
        self.clock = clock
        self.notifier = notifier or Notifier(config)
        self._last_run: dict[str, float] = {}

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC)

    def due_groups(self, now_s: float) -> list[RuleGroup]:
        return [
            g for g in self.config.groups if now_s - self._last_run.get(g.name, -math.inf) >= g.interval_s
        ]

    def tick(self) -> EvaluationResult:
        """Evaluate the groups that are due, expire pushed alerts, flush due notification groups."""
        now_s = self.clock()
        groups = self.due_groups(now_s)
        for g in groups:
            self._last_run[g.name] = now_s
        return self._run(groups, dt.datetime.fromtimestamp(now_s, dt.UTC))

    def evaluate(self) -> EvaluationResult:
        return self._run(list(self.config.groups), self._now())

    def _read(self, rules: Iterable[Rule]) -> tuple[dict[str, Sequence[Sample]], list[tuple[str, str]]]:
        samples: dict[str, Sequence[Sample]] = {}
        errors = []
        for rule in rules:
            try:
                if all(_guard_holds(g, self.signals) for g in rule.while_):
                    samples[rule.key] = [
                        s
                        for s in self.signals.read(rule.condition.signal, rule.by)
                        if not math.isnan(s.value)
                    ]
                else:
                    samples[rule.key] = []
            except Exception as exc:  # a failing source must not stop the other rules
                errors.append((rule.key, f"{type(exc).__name__}: {exc}"))
        return samples, errors

    def _run(self, groups: Sequence[RuleGroup], now: dt.datetime) -> EvaluationResult:
        rules = [r for g in groups for r in g.rules]
        samples, errors = self._read(rules)  # outside the transaction: no lock held while reading
        transitions: list[Transition] = []
        queued: list[str] = []
        with self.engine.begin() as conn:
            current = load_alerts(conn, rule_keys=list(samples))
            for rule in rules:
                if rule.key in samples:
                    t, q = self._step_rule(conn, rule, samples[rule.key], current, now)
                    transitions += t
                    queued += q
            transitions += self._expire_pushed(conn, now)
            record_transitions(conn, transitions, now)
            flushes = self.notifier.process(conn, now)
        return EvaluationResult(
            now, len(samples), tuple(transitions), tuple(queued), tuple(flushes), tuple(errors)
        )

    def _step_rule(
        self,
        conn: Connection,
        rule: Rule,
        samples: Sequence[Sample],
        current: Mapping[str, ActiveAlert],
        now: dt.datetime,
    ) -> tuple[list[Transition], list[str]]:
        seen: dict[str, tuple[ActiveAlert, float]] = {}
        for s in samples:
            labels = {**s.label_dict(), **dict(rule.labels), "alertname": rule.name}
            if not rule.condition.holds(s.value):
                continue
            fp = fingerprint(labels)
            annotations = {k: render(v, labels, s.value) for k, v in rule.annotations}
            seen[fp] = (
                ActiveAlert(
                    fp,
                    rule.key,
                    rule.name,
                    tuple(sorted(labels.items())),
                    tuple(sorted(annotations.items())),
                    "pending",
                    s.value,
                    "",
                    now,
                ),
                s.value,
            )
        transitions, queued = [], []
        mine = {fp: a for fp, a in current.items() if a.rule_key == rule.key}
        for fp in set(mine) | set(seen):
            prev = mine.get(fp)
            new, value = seen.get(fp, (None, None))
            after, moves = step(
                prev,
                holds=fp in seen,
                value=value,
                now=now,
                for_s=rule.for_s,
                keep_firing_for_s=rule.keep_firing_for_s,
                new=new,
            )
            if after is None:
                if prev is not None:
                    delete_alert(conn, fp)
            elif after != prev:
                save_alert(conn, after, now, exists=prev is not None)
            ref = after or prev
            assert ref is not None
            for from_state, to_state in moves:
                transitions.append(
                    Transition(fp, rule.name, ref.episode, from_state, to_state, ref.value, ref.labels)
                )
                if to_state == "firing" and after is not None:
                    queued += self._queue_actions(conn, rule, after, now)
        return transitions, queued

    def _queue_actions(self, conn: Connection, rule: Rule, alert: ActiveAlert, now: dt.datetime) -> list[str]:
        keys = []
        for action in rule.actions:
            key = action_run_key(action, alert.episode)
            if conn.execute(select(action_runs.c.id).where(action_runs.c.run_key == key)).first() is not None:
                continue
            conn.execute(
                insert(action_runs).values(
                    run_key=key,
                    action=action.type,
                    trigger="rule",
                    alertname=rule.name,
                    spec=json.dumps(action.to_json()),
                    labels=json.dumps(alert.label_dict(), sort_keys=True),
                    state="pending",
                    created_at=now,
                    detail=json.dumps({"episode": alert.episode, "value": alert.value}),
                )
            )
            keys.append(key)
        return keys

    def _expire_pushed(self, conn: Connection, now: dt.datetime) -> list[Transition]:
        out = []
        for a in load_alerts(conn, states=("firing",)).values():
            if a.rule_key is None and a.ends_at is not None and a.ends_at <= now:
                resolve_alert(conn, a, now)
                out.append(
                    Transition(a.fingerprint, a.alertname, a.episode, "firing", "resolved", a.value, a.labels)
                )
        return out
