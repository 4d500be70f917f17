"""Reading windows from files: the three formats, and one clear typed error per bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from infersight.monitor.drift import read_window
from infersight.monitor.drift.errors import (
    BadRecord,
    CurrentWindowEmpty,
    InputFileNotFound,
    InputNotUTF8,
    NoTextColumn,
    ReferenceWindowEmpty,
    UnknownInputFormat,
)


def test_jsonl_reads_prompts_and_responses(tmp_path: Path) -> None:
    f = tmp_path / "w.jsonl"
    f.write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c"}\n{"prompt": "  "}\n', encoding="utf-8")
    w = read_window(f)
    assert w.prompts == ("a", "c")
    assert w.responses == ("b", None)


def test_csv_takes_the_text_or_prompt_column(tmp_path: Path) -> None:
    f = tmp_path / "w.csv"
    f.write_text('id,Text\n1,"hello, world"\n2,second\n', encoding="utf-8")
    assert read_window(f).prompts == ("hello, world", "second")
    g = tmp_path / "g.csv"
    g.write_text("prompt,response\nq1,a1\nq2,\n", encoding="utf-8")
    w = read_window(g)
    assert w.prompts == ("q1", "q2") and w.responses == ("a1", None)


def test_plain_text_is_one_text_per_line(tmp_path: Path) -> None:
    f = tmp_path / "w.txt"
    f.write_text("\ufefffirst\n\nsecond\n", encoding="utf-8")
    w = read_window(f)
    assert w.prompts == ("first", "second") and w.responses == ()


@pytest.mark.parametrize(
    ("name", "content", "error", "message"),
    [
        ("w.xml", b"<a/>", UnknownInputFormat, "unknown input format '.xml'"),
        ("w.txt", b"ok\n\xff\xfe bad\n", InputNotUTF8, "offset 3"),
        ("w.csv", b"id,label\n1,x\n", NoTextColumn, "columns found: id, label"),
        ("w.jsonl", b'{"prompt": "a"}\nnot json\n', BadRecord, "line 2"),
        ("w.jsonl", b'["a"]\n', BadRecord, "expected a JSON object"),
        ("w.jsonl", b'{"text": 3}\n', BadRecord, "no string `prompt`"),
        ("w.txt", b"\n  \n", CurrentWindowEmpty, "current window is empty"),
    ],
)
def test_bad_input_raises_a_typed_error_naming_the_file(
    tmp_path: Path, name: str, content: bytes, error: type[Exception], message: str
) -> None:
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(error) as caught:
        read_window(f)
    assert message in str(caught.value)
    assert str(f) in str(caught.value)


def test_missing_file_and_empty_reference_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputFileNotFound, match="no such file"):
        read_window(tmp_path / "nope.jsonl")
    empty = tmp_path / "e.csv"
    empty.write_text("text\n", encoding="utf-8")
    with pytest.raises(ReferenceWindowEmpty, match="reference window is empty"):
        read_window(empty, "reference")
