"""GenAI spans to `InferenceRecord`s: which spans of an OTLP export are model calls, and
what each becomes (docs/otlp.md has the table).

A span is a model call when `gen_ai.operation.name` names a generation (`chat`,
`text_completion`, `generate_content`), when OpenInference marks it `LLM`, when
OpenLLMetry's `llm.request.type` says `chat` or `completion`, or, without any of these,
when it carries GenAI attributes that only a generation has (vLLM's server span
`llm_request`: usage, latency and model names). Every other span is skipped and counted
by reason; a model call that cannot become a record (no model name, impossible timing, an
out-of-range count) is rejected and counted, and the receiver names it in OTLP's
`partial_success`. Nothing here raises on a span's content.

The attribute sets read: the current semantic conventions (`gen_ai.usage.input_tokens`,
`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions`,
`gen_ai.response.finish_reasons`, `error.type`), vLLM's `SpanAttributes`
(`gen_ai.usage.prompt_tokens`, `gen_ai.latency.time_to_first_token`,
`gen_ai.latency.time_in_queue`, `gen_ai.latency.e2e`), OpenLLMetry's indexed
`gen_ai.prompt.N.*` / `gen_ai.completion.N.*`, OpenInference's `llm.input_messages.N.*`,
`llm.output_messages.N.*`, `llm.token_count.*`, `input.value` / `output.value`, and the older
`gen_ai.content.prompt` / `gen_ai.content.completion` span events. A streaming span without
a TTFT attribute takes its first-token event's time (OpenInference's `First Token Stream
Event`, OpenLLMetry's first `gen_ai.content.completion.chunk`).

Texts follow the service's privacy rules, as the SDK's do: kept for `text_sample_rate` of
the calls, passed through the `redact` hook before they are stored (a hook that fails drops
the text), cut at `MAX_TEXT_CHARS`. The request's shape is kept in the record (the release
checks compare requests of the same shape): `gen_ai.request.max_tokens` (or OpenInference's
`llm.invocation_parameters`), the stream flag where a producer records one
(`gen_ai.request.stream`, OpenLLMetry's `llm.is_streaming`) and the first finish reason
(`function_call` kept as `tool_calls`, unknown ones as `other`); every finish reason is
also counted (a metric). A malformed parameter is dropped, never a reason to reject."""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from infersight.monitor.records import (
    CLIENT_ERROR,
    DEFAULT_LIMITS,
    MAX_TEXT_CHARS,
    InferenceRecord,
    RecordLimits,
    build_record,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = [
    "FINISH_REASONS",
    "REJECT_REASONS",
    "SKIP_REASONS",
    "SpanBatch",
    "TextPolicy",
    "records_from_spans",
]

log = logging.getLogger(__name__)
GENERATIONS = frozenset({"chat", "text_completion", "completion", "generate_content"})
FINISH_REASONS = ("stop", "length", "content_filter", "tool_calls", "function_call", "error", "other")
SKIP_REASONS = ("not_genai", "not_a_generation", "evaluation")  # spans that are no model call: not errors
REJECT_REASONS = ("no_id", "no_model", "bad_timing", "bad_value")  # model calls that cannot become records
_MAX_LABEL = 256
_MAX_EPOCH_NS = 253_402_300_799 * 10**9
# what an OpenAI client raises for a 4xx: the caller's doing, kept as CLIENT_ERROR (as the proxy does)
_CLIENT_ERRORS = frozenset({"BadRequestError", "AuthenticationError", "PermissionDeniedError",
                            "NotFoundError", "ConflictError", "UnprocessableEntityError"})  # fmt: skip
_INDEXED = re.compile(
    r"^(gen_ai\.prompt|gen_ai\.completion|llm\.input_messages|llm\.output_messages)\.(\d+)\.(.+)$"
)
_INDEXED_PREFIXES = ("gen_ai.prompt.", "gen_ai.completion.", "llm.input_messages.", "llm.output_messages.")
_TEXT_KEYS = frozenset({"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
                        "input.value", "output.value", "gen_ai.prompt", "gen_ai.completion"})  # fmt: skip
_FIRST_TOKEN_EVENTS = ("First Token Stream Event", "gen_ai.content.completion.chunk")


@dataclass(frozen=True)
class TextPolicy:
    """The service's text rules: the share of calls whose text is kept, and the redact hook."""

    sample_rate: float = 1.0
    redact: Callable[[str], str] | None = None
    rng: random.Random = field(default_factory=random.Random)


@dataclass(frozen=True)
class SpanBatch:
    """What an export became: the records, and the spans left out, counted by reason."""

    records: tuple[InferenceRecord, ...]
    spans: int
    skipped: Mapping[str, int]  # no model call (an HTTP client span, a tool call)
    rejected: Mapping[str, int]  # a model call that cannot be a record
    finish_reasons: Mapping[str, int]

    @property
    def rejected_spans(self) -> int:
        return sum(self.rejected.values())

    def error_message(self) -> str:
        """OTLP's `partial_success.error_message`: why spans were rejected; empty when none were."""
        return "; ".join(
            f"{n} span(s) rejected: {_WHY[reason]}" for reason, n in sorted(self.rejected.items())
        )


_WHY = {
    "no_id": "a span without a trace id or span id",
    "no_model": "a GenAI span names no model (gen_ai.request.model, gen_ai.response.model, llm.model_name)",
    "bad_timing": "start or end time missing, reversed, after the year 9999 or further apart than "
    "limits.max_duration_s",
    "bad_value": "a token count or latency attribute is negative, not a number or out of range "
    "(limits.max_duration_s, limits.max_tokens)",
}


class _Rejected(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def records_from_spans(
    request: ExportTraceServiceRequest, policy: TextPolicy, limits: RecordLimits = DEFAULT_LIMITS
) -> SpanBatch:
    records: list[InferenceRecord] = []
    skipped: Counter[str] = Counter()
    rejected: Counter[str] = Counter()
    finish: Counter[str] = Counter()
    spans = 0
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans += 1
                attrs = _SpanAttributes(span.attributes)
                why_not = _not_a_model_call(attrs)
                if why_not is not None:
                    skipped[why_not] += 1
                    continue
                try:
                    record, reasons = _record(span, attrs, resource, policy, limits)
                except _Rejected as exc:
                    rejected[exc.reason] += 1
                    continue
                # a shape not foreseen; RecursionError: a value nested past the stack
                except (TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
                    log.warning("OTLP span %s not read: %s: %s", span.span_id.hex(), type(exc).__name__, exc)
                    rejected["bad_value"] += 1
                    continue
                records.append(record)
                finish.update(reasons)
    return SpanBatch(tuple(records), spans, dict(skipped), dict(rejected), dict(finish))


# -- attributes -------------------------------------------------------------------------
def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    return getattr(v, kind)


_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value", "bytes_value"})


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    out = {}
    for kv in pairs:  # the per-span hot loop: scalars read inline
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = getattr(value, kind) if kind in _SCALARS else _value(value)
    return out


class _SpanAttributes(Mapping[str, Any]):
    """A span's attributes, each value converted from its `AnyValue` when read: a span has
    a dozen or more attributes, of which a handful are read."""

    __slots__ = ("_raw",)

    def __init__(self, pairs: Iterable[KeyValue]) -> None:
        self._raw = {kv.key: kv.value for kv in pairs}

    def __getitem__(self, key: str) -> Any:
        return _value(self._raw[key])

    def get(self, key: str, default: Any = None) -> Any:
        value = self._raw.get(key)
        return default if value is None else _value(value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw


def _not_a_model_call(attrs: Mapping[str, Any]) -> str | None:
    if "gen_ai.request.model" not in attrs and any(k.startswith("gen_ai.evaluation.") for k in attrs):
        return "evaluation"  # an evaluation of a call (feedback: otlp_feedback.py), not a call
    operation = attrs.get("gen_ai.operation.name")
    if operation is not None:
        return None if isinstance(operation, str) and operation in GENERATIONS else "not_a_generation"
    kind = attrs.get("openinference.span.kind")
    if kind is not None:
        return None if str(kind).upper() == "LLM" else "not_a_generation"
    request_type = attrs.get("llm.request.type")
    if request_type is not None:
        return (
            None
            if isinstance(request_type, str) and request_type in ("chat", "completion")
            else "not_a_generation"
        )
    if any(key.startswith(("gen_ai.", "llm.")) for key in attrs):
        return None  # vLLM's server span and older conventions: GenAI attributes, no operation
    return "not_genai"


def _first(attrs: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def _label(value: Any) -> str | None:
    return str(value)[:_MAX_LABEL] if value is not None and str(value) else None


def _seconds(value: Any, longest: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= longest:
        raise _Rejected("bad_value")  # NaN fails the comparison too
    return float(value)


def _tokens(value: Any, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise _Rejected("bad_value")
    return value


# -- one span ---------------------------------------------------------------------------
def _record(
    span: Span,
    attrs: Mapping[str, Any],
    resource: Mapping[str, Any],
    policy: TextPolicy,
    limits: RecordLimits,
) -> tuple[InferenceRecord, list[str]]:
    if not span.trace_id or not span.span_id:
        raise _Rejected("no_id")
    model = _label(attrs.get("gen_ai.request.model") or _invoked_model(attrs) or
                   _first(attrs, "llm.model_name", "gen_ai.response.model"))  # fmt: skip
    served = _label(_first(attrs, "gen_ai.response.model", "llm.model_name"))
    if model is None:
        raise _Rejected("no_model")
    version = _label(resource.get("infersight.model_version")) or (
        served if served is not None and served != model else None
    ) or _label(resource.get("service.version")) or model  # fmt: skip
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start <= 0 or end < start or end > _MAX_EPOCH_NS:
        raise _Rejected("bad_timing")
    longest, most = limits.max_duration_s, limits.max_tokens
    duration = (end - start) / 1e9
    if duration > longest:
        raise _Rejected("bad_timing")
    e2e = _seconds(attrs.get("gen_ai.latency.e2e"), longest)
    if duration == 0.0 and e2e is not None:
        duration = e2e
    ttft = _seconds(
        _first(attrs, "gen_ai.latency.time_to_first_token", "gen_ai.response.time_to_first_chunk"), longest
    )
    if ttft is None:
        ttft = _first_token_event(span)
        if ttft is not None and ttft > longest:
            raise _Rejected("bad_timing")
    output_tokens = _tokens(
        _first(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion"),
        most,
    )  # fmt: skip
    prompt_tokens = _tokens(
        _first(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"),
        most,
    )
    tpot = None
    if ttft is not None and output_tokens is not None and output_tokens >= 2 and duration >= ttft:
        tpot = (duration - ttft) / (output_tokens - 1)
    prompt, system, response = _texts(span, attrs, policy)
    # fields checked above: built without the dataclass __init__ (records.build_record)
    reasons = _finish_reasons(attrs)
    max_tokens, stream = _asked(attrs, most)
    record = build_record(
        f"otlp-{span.trace_id.hex()}-{span.span_id.hex()}", model, version, start / 1e9, duration, ttft, tpot,
        _seconds(attrs.get("gen_ai.latency.time_in_queue"), longest), prompt_tokens, output_tokens,
        _error_type(span, attrs), prompt, response, "otlp", None, system, max_tokens, stream,
        _STORED_FINISH.get(reasons[0], "other") if reasons else None,
    )  # fmt: skip
    return record, reasons


# the metric's finish reasons as a record keeps them (records.FINISH_REASONS)
_STORED_FINISH = {"stop": "stop", "length": "length", "content_filter": "content_filter",
                  "tool_calls": "tool_calls", "function_call": "tool_calls", "error": "error"}  # fmt: skip


def _asked(attrs: Mapping[str, Any], most: int) -> tuple[int | None, bool | None]:
    """(max_tokens, stream) as the span records the request's parameters; None where it does
    not say or says something out of range."""
    params = _json(attrs.get("llm.invocation_parameters"))
    params = params if isinstance(params, dict) else {}
    budget = _first(attrs, "gen_ai.request.max_tokens", "llm.request.max_tokens")
    if budget is None:
        budget = params.get("max_completion_tokens", params.get("max_tokens"))
    if isinstance(budget, float) and budget.is_integer():
        budget = int(budget)
    if isinstance(budget, str) and budget.isascii() and budget.isdigit() and len(budget) <= 10:
        budget = int(budget)
    ok = type(budget) is int and 1 <= budget <= most
    stream = _first(attrs, "gen_ai.request.stream", "llm.is_streaming")
    if stream is None:
        stream = params.get("stream")
    return (budget if ok else None), (stream if isinstance(stream, bool) else None)


def _invoked_model(attrs: Mapping[str, Any]) -> Any:
    """The model OpenInference's `llm.invocation_parameters` asked for (its `llm.model_name`
    is the one that answered)."""
    params = _json(attrs.get("llm.invocation_parameters"))
    return params.get("model") if isinstance(params, dict) else None


def _first_token_event(span: Span) -> float | None:
    for event in span.events:
        if event.name in _FIRST_TOKEN_EVENTS and event.time_unix_nano >= span.start_time_unix_nano:
            return (event.time_unix_nano - span.start_time_unix_nano) / 1e9
    return None


def _error_type(span: Span, attrs: Mapping[str, Any]) -> str | None:
    given = _label(attrs.get("error.type"))
    if span.status.code != Status.STATUS_CODE_ERROR and given is None:
        return None
    if given is None:
        for event in span.events:
            if event.name == "exception":
                given = _label(_attributes(event.attributes).get("exception.type"))
                break
    if given is not None and given.rpartition(".")[2] in _CLIENT_ERRORS:
        return CLIENT_ERROR
    return given or "error"


def _finish_reasons(attrs: Mapping[str, Any]) -> list[str]:
    given = _first(
        attrs, "gen_ai.response.finish_reasons", "gen_ai.completion.0.finish_reason", "llm.finish_reason"
    )
    values = given if isinstance(given, list) else [given] if given is not None else []
    return [v if v in FINISH_REASONS else "other" for v in map(str, values)]


# -- texts ------------------------------------------------------------------------------
Message = tuple[str, str]  # (role, text)


def _texts(
    span: Span, attrs: Mapping[str, Any], policy: TextPolicy
) -> tuple[str | None, str | None, str | None]:
    """(prompt: the last user message, system: the system messages before it, response)."""
    if policy.sample_rate < 1.0 and policy.rng.random() >= policy.sample_rate:
        return None, None, None
    if (
        not span.events
        and _TEXT_KEYS.isdisjoint(attrs)
        and not any(k.startswith(_INDEXED_PREFIXES) for k in attrs)
    ):
        return None, None, None  # most spans carry no text (vLLM's never do): nothing to look for
    inputs, outputs = _messages(span, attrs)
    users = [i for i, (role, _) in enumerate(inputs) if role == "user"]
    last = users[-1] if users else len(inputs) - 1
    prompt = inputs[last][1] if inputs else None
    system = "\n".join(t for role, t in inputs[:last] if role in ("system", "developer") and t) or None
    instructions = _parts_text(_json(attrs.get("gen_ai.system_instructions")))
    if instructions:
        system = instructions if system is None else f"{instructions}\n{system}"
    response = "".join(t for role, t in outputs if role in ("assistant", "")) or None
    return _kept(prompt, policy), _kept(system, policy), _kept(response, policy)


def _kept(text: str | None, policy: TextPolicy) -> str | None:
    if text is None:
        return None
    if policy.redact is not None:
        try:
            text = policy.redact(text)
        except Exception:  # the SDK's rule: unredacted text is never kept
            return None
        if not isinstance(text, str):
            return None
    return text[:MAX_TEXT_CHARS]


def _messages(span: Span, attrs: Mapping[str, Any]) -> tuple[list[Message], list[Message]]:
    inputs = _semconv_messages(attrs.get("gen_ai.input.messages"))
    outputs = _semconv_messages(attrs.get("gen_ai.output.messages"))
    if not inputs or not outputs:
        indexed = _indexed(attrs)
        inputs = inputs or indexed.get("gen_ai.prompt", []) or indexed.get("llm.input_messages", [])
        outputs = outputs or indexed.get("gen_ai.completion", []) or indexed.get("llm.output_messages", [])
    if not inputs or not outputs:
        event_in, event_out = _event_texts(span)
        inputs, outputs = inputs or event_in, outputs or event_out
    if not inputs:
        inputs = _value_messages(attrs.get("input.value"), attrs.get("input.mime_type"), request=True)
        inputs = inputs or _plain(attrs.get("gen_ai.prompt"), "user")
    if not outputs:
        outputs = _value_messages(attrs.get("output.value"), attrs.get("output.mime_type"), request=False)
        outputs = outputs or _plain(attrs.get("gen_ai.completion"), "assistant")
    return inputs, outputs


def _plain(value: Any, role: str) -> list[Message]:
    return [(role, value)] if isinstance(value, str) and value else []


def _json(value: Any) -> Any:
    """A JSON-valued attribute parsed; None when it is not JSON. Nesting past the parser's
    recursion limit is as unparseable as any other bad JSON, and so is a lone surrogate
    escape (`"\\ud800"`), which would make a text no store can encode: the attribute is
    dropped, the span kept. orjson refuses both; Python's json raises RecursionError on
    the first and returns the second."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return orjson.loads(value)
        except (ValueError, RecursionError):
            return None
    return value


def _parts_text(parts: Any) -> str:
    """The text of a message's content: a string, OpenAI's content parts, or the semantic
    conventions' `parts` (`{"type": "text", "content": ...}`)."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    texts = []
    for p in parts:
        if isinstance(p, str):
            texts.append(p)
        elif isinstance(p, dict) and p.get("type", "text") == "text":
            text = p.get("content", p.get("text"))
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts)


def _semconv_messages(value: Any) -> list[Message]:
    """`gen_ai.input.messages` / `gen_ai.output.messages`: a JSON array of {role, parts}."""
    value = _json(value)
    if not isinstance(value, list):
        return []
    out = []
    for m in value:
        if isinstance(m, dict):
            content = m.get("parts", m.get("content"))
            out.append((str(m.get("role", "")), _parts_text(content)))
    return out


def _indexed(attrs: Mapping[str, Any]) -> dict[str, list[Message]]:
    """OpenLLMetry's `gen_ai.prompt.N.{role,content}` and OpenInference's
    `llm.input_messages.N.message.{role,content}`, in index order."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for key, value in attrs.items():
        match = _INDEXED.match(key) if key.startswith(_INDEXED_PREFIXES) else None
        if match is not None:
            prefix, index, rest = match.groups()
            found.setdefault(prefix, {}).setdefault(int(index), {})[rest.removeprefix("message.")] = value
    out: dict[str, list[Message]] = {}
    for prefix, by_index in found.items():
        messages = []
        for _, fields in sorted(by_index.items()):
            text = fields.get("content")
            if not isinstance(text, str):  # OpenInference's content parts
                parts = sorted(
                    k for k in fields if k.startswith("contents.") and k.endswith("message_content.text")
                )
                text = "".join(str(fields[k]) for k in parts)
            default = "user" if prefix in ("gen_ai.prompt", "llm.input_messages") else "assistant"
            messages.append((str(fields.get("role", default)), text))
        out[prefix] = messages
    return out


def _event_texts(span: Span) -> tuple[list[Message], list[Message]]:
    """The older conventions' `gen_ai.content.prompt` / `gen_ai.content.completion` events."""
    inputs: list[Message] = []
    outputs: list[Message] = []
    for event in span.events:
        if event.name == "gen_ai.content.prompt":
            inputs = inputs or _plain(_attributes(event.attributes).get("gen_ai.prompt"), "user")
        elif event.name == "gen_ai.content.completion":
            outputs = outputs or _plain(_attributes(event.attributes).get("gen_ai.completion"), "assistant")
    return inputs, outputs


def _value_messages(value: Any, mime: Any, *, request: bool) -> list[Message]:
    """OpenInference's `input.value` / `output.value`: plain text as it is; a JSON OpenAI
    request (its messages or prompt) or answer (its first choice)."""
    if not isinstance(value, str) or not value:
        return []
    if mime != "application/json":
        return [("user" if request else "assistant", value)]
    body = _json(value)
    if not isinstance(body, dict):
        return []
    if request:
        messages = body.get("messages")
        if isinstance(messages, list):
            return [
                (str(m.get("role", "")), _parts_text(m.get("content")))
                for m in messages
                if isinstance(m, dict)
            ]
        prompt = body.get("prompt")
        return _plain(prompt[0] if isinstance(prompt, list) and prompt else prompt, "user")
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return [("assistant", _parts_text(message.get("content")))]
        return _plain(choices[0].get("text"), "assistant")
    return []
