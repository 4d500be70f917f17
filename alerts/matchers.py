"""Label matchers as Alertmanager writes them: `severity="critical"`, `team!=ml`,
`alertname=~"GPU.*"`, `model!~"test-.*"` (regular expressions are fully anchored).

Regular expressions run on RE2 (google-re2), the engine Alertmanager's Go regexp also
implements: linear time in the label's length, so a silence or route written by a user
cannot stall the notifier (no catastrophic backtracking as with Python's `re`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import re2

from .errors import InvalidMatcher

__all__ = ["Matcher", "matches_all", "parse_matcher"]

MatchOp = Literal["=", "!=", "=~", "!~"]
_FORM = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern becomes InvalidMatcher, not a line on stderr


@dataclass(frozen=True)
class Matcher:
    name: str
    op: MatchOp
    value: str
    _regex: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op in ("=~", "!~"):
            try:
                regex = re2.compile(self.value, _RE2_OPTIONS)
            except re2.error as exc:
                reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
                raise InvalidMatcher(f"{self}: bad regular expression: {reason}") from exc
            object.__setattr__(self, "_regex", regex)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = self._regex.fullmatch(actual) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "op": self.op, "value": self.value}

    @classmethod
    def from_json(cls, obj: Mapping[str, str]) -> Matcher:
        op = obj.get("op", "=")
        if op not in ("=", "!=", "=~", "!~"):
            raise InvalidMatcher(f"unknown matcher operator {op!r}")
        return cls(str(obj["name"]), cast(MatchOp, op), str(obj["value"]))


def parse_matcher(text: str) -> Matcher:
    """`name op value`, value optionally in double quotes."""
    m = _FORM.match(text)
    if m is None:
        raise InvalidMatcher(f'not a matcher: {text!r} (expected e.g. severity="critical")')
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return Matcher(name, cast(MatchOp, op), value)


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
