"""Comments and docstrings in the source say why, in words: no internal issue numbers (they
mean nothing to a reader of the code) and no measured figures (they change with every
machine and run; measurements live in docs/benchmarks/, which a comment may point to)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("engine", "collectors", "monitor", "alerts", "dashboards", "benchmarks")

ISSUE = re.compile(r"\bissues? \d+\b|(?<![\w&])#\d+\b|\bissue-\d+\b", re.IGNORECASE)
# A number with a unit that only a measurement gives: a time per operation in ns or us, a
# ratio "3x faster", a rate per second, a share of the CPU or time, or "about/took 12 ms".
# Settings and limits ("every 50 ms", "a 7 MB prompt", "10% of users") are not matched.
_NUMBER = r"\d[\d.,]*(?:-\d[\d.,]*)?"
FIGURE = re.compile(
    rf"(?<![\w.]){_NUMBER}\s?(?:(?:ns|us|µs)\b|x (?:faster|slower|less|more|the|as)\b"
    r"|(?:tok|tokens|texts|events|requests|req)/s\b|[GM]B/s\b"
    r"|% of (?:the |its |a )?(?:service's |process's )?(?:CPU|time|samples)\b)"
    rf"|\b(?:about|measured|took|takes|costs?) {_NUMBER}\s?(?:ms|s|%|x)(?![\w/])",
    re.IGNORECASE,
)


def _comments(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".c", ".h"):
        for match in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.DOTALL):
            yield text.count("\n", 0, match.start()) + 1, match.group()
        return
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield (node.body[0].lineno if node.body else 1), doc


def _offenders() -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".c", ".h") or not path.is_file():
                continue
            for line, comment in _comments(path):
                for kind, pattern in (("issue number", ISSUE), ("measured figure", FIGURE)):
                    for match in pattern.finditer(comment):
                        found.append(f"{path.relative_to(ROOT)}:{line}: {kind} {match.group()!r}")
    return found


def test_no_issue_numbers_or_measured_figures_in_code_comments() -> None:
    offenders = _offenders()
    assert not offenders, "say why in words, point to docs/benchmarks/ for figures:\n" + "\n".join(offenders)


def test_the_patterns_catch_what_they_are_for() -> None:
    for text in ("see issue 24", "(#11)", "about 170 ns less per call", "3-4x faster", "41,416 events/s",
                 "9% of the service's CPU", "took 12 ms"):  # fmt: skip
        assert ISSUE.search(text) or FIGURE.search(text), text
    for text in ("every 50 ms", "a 7 MB prompt", "10% of users", "2 x MR sums", "HTTP 429", "[64, 16]"):
        assert not (ISSUE.search(text) or FIGURE.search(text)), text
