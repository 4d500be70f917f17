"""Reading a window of texts from a file: .jsonl, .csv or plain text (one per line).

- `.jsonl` / `.ndjson`: one JSON object per line with a string `prompt` (or `text`) and,
  optionally, a string `response`.
- `.csv`: a header row with a `text` or `prompt` column, optionally `response`.
- `.txt`: one text per line.

Blank texts are skipped. Every problem is a typed error naming the file.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Literal

from ._windows import TextWindow
from .errors import (
    BadRecord,
    CurrentWindowEmpty,
    InputFileNotFound,
    InputNotUTF8,
    NoTextColumn,
    ReferenceWindowEmpty,
    UnknownInputFormat,
)

__all__ = ["INPUT_FORMATS", "read_window"]

INPUT_FORMATS: tuple[str, ...] = (".jsonl", ".ndjson", ".csv", ".txt")


def read_window(path: str | Path, role: Literal["reference", "current"] = "current") -> TextWindow:
    """The texts of `path`; raises `ReferenceWindowEmpty` / `CurrentWindowEmpty` (by `role`)
    when it holds none."""
    p = Path(path)
    shown = str(path)
    if not p.is_file():
        raise InputFileNotFound(shown)
    suffix = p.suffix.lower()
    if suffix not in INPUT_FORMATS:
        raise UnknownInputFormat(shown, suffix, INPUT_FORMATS)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputNotUTF8(shown, exc.start) from exc
    if suffix in (".jsonl", ".ndjson"):
        prompts, responses = _jsonl(shown, text)
    elif suffix == ".csv":
        prompts, responses = _csv(shown, text)
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
        responses = []
    if not prompts:
        raise ReferenceWindowEmpty(shown) if role == "reference" else CurrentWindowEmpty(shown)
    if all(r is None for r in responses):
        responses = []
    return TextWindow(tuple(prompts), tuple(responses), shown)


def _jsonl(path: str, text: str) -> tuple[list[str], list[str | None]]:
    prompts: list[str] = []
    responses: list[str | None] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadRecord(path, number, f"not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise BadRecord(path, number, "expected a JSON object")
        prompt = obj.get("prompt", obj.get("text"))
        if not isinstance(prompt, str):
            raise BadRecord(path, number, "no string `prompt` field")
        response = obj.get("response")
        if response is not None and not isinstance(response, str):
            raise BadRecord(path, number, "`response` must be a string or null")
        if not prompt.strip():
            continue
        prompts.append(prompt.strip())
        responses.append(response.strip() if response and response.strip() else None)
    return prompts, responses


def _csv(path: str, text: str) -> tuple[list[str], list[str | None]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = tuple(c.strip() for c in (reader.fieldnames or ()))
    names = {c.strip().lower(): c for c in (reader.fieldnames or ())}
    column = names.get("text") or names.get("prompt")
    if column is None:
        raise NoTextColumn(path, columns)
    response_column = names.get("response")
    prompts: list[str] = []
    responses: list[str | None] = []
    try:
        for row in reader:
            value = (row.get(column) or "").strip()
            if not value:
                continue
            prompts.append(value)
            answer = (row.get(response_column) or "").strip() if response_column else ""
            responses.append(answer or None)
    except csv.Error as exc:
        raise BadRecord(path, reader.line_num, f"malformed CSV ({exc})") from exc
    return prompts, responses
