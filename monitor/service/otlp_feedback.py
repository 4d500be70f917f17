"""Feedback carried by OTLP traces: the GenAI conventions' evaluation results.

OpenTelemetry's GenAI semantic conventions record an evaluation of a model's answer as a
`gen_ai.evaluation.result` event, with `gen_ai.evaluation.name` (what was judged),
`gen_ai.evaluation.score.value` (a number), `gen_ai.evaluation.score.label` (a word) and,
optionally, `gen_ai.response.id` (the answer judged). Here they are read where a trace
carries them: as events on a span, or as the attributes of an evaluation span of their own.

Which request it judges, in order: `gen_ai.response.id` (the answer's id, as served or
proxied); for an event, the span it sits on (the request that span became:
`otlp-<trace>-<span>`); for an evaluation span, its parent span. The feedback is kept
whether or not that request is known yet, and joins it when it is (or expires).

The score: a value in [0, 1] as it is; otherwise a label this module knows as good or bad
(pass/fail, relevant/irrelevant, ...); anything else is not feedback and is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from infersight.monitor.business import Feedback
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .otlp_spans import _attributes

__all__ = ["EVALUATION_EVENT", "feedback_from_spans"]

EVALUATION_EVENT = "gen_ai.evaluation.result"
_GOOD = frozenset(
    {"pass", "passed", "good", "relevant", "correct", "up", "positive", "true", "yes", "helpful"}
)
_BAD = frozenset(
    {"fail", "failed", "bad", "irrelevant", "incorrect", "down", "negative", "false", "no", "unhelpful"}
)


def _score(attrs: Mapping[str, Any]) -> tuple[float, str] | None:
    value = attrs.get("gen_ai.evaluation.score.value")
    label = attrs.get("gen_ai.evaluation.score.label")
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= 1
    ):
        return float(value), (str(label)[:32] if isinstance(label, str) and label else repr(float(value)))
    if isinstance(label, str):
        word = label.strip().lower()
        if word in _GOOD:
            return 1.0, word[:32]
        if word in _BAD:
            return 0.0, word[:32]
    return None


def _item(attrs: Mapping[str, Any], fallback_id: str | None) -> Feedback | None:
    scored = _score(attrs)
    response_id = attrs.get("gen_ai.response.id")
    request_id = response_id if isinstance(response_id, str) and 0 < len(response_id) <= 256 else fallback_id
    if scored is None or request_id is None:
        return None
    name = attrs.get("gen_ai.evaluation.name")
    kind = name[:64] if isinstance(name, str) and name else None
    return Feedback(request_id, scored[0], scored[1], kind=kind)


def feedback_from_spans(export: ExportTraceServiceRequest) -> list[Feedback]:
    """Every evaluation result in the export, with the request it judges."""
    out: list[Feedback] = []
    for resource_spans in export.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                trace = span.trace_id.hex()
                if span.span_id:
                    for event in span.events:
                        if event.name == EVALUATION_EVENT:
                            item = _item(_attributes(event.attributes), f"otlp-{trace}-{span.span_id.hex()}")
                            if item is not None:
                                out.append(item)
                attrs = _attributes(span.attributes)
                if "gen_ai.evaluation.score.value" in attrs or "gen_ai.evaluation.score.label" in attrs:
                    parent = f"otlp-{trace}-{span.parent_span_id.hex()}" if span.parent_span_id else None
                    item = _item(attrs, parent)
                    if item is not None:
                        out.append(item)
    return out
