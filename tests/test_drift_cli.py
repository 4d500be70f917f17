"""`infersight drift REFERENCE CURRENT`: the verdict, --json, --report, and bad input as one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from infersight.monitor.cli import main
from infersight.monitor.data import banking77, hotels


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("drift_cli")
    bank = [u.text for u in banking77("test")]
    hotel = [u.text for u in hotels()]
    ref = d / "reference.txt"
    ref.write_text("\n".join(bank[:120]) + "\n", encoding="utf-8")
    cur = d / "current.jsonl"
    with cur.open("w", encoding="utf-8") as f:
        for text in bank[200:260] + hotel[:30]:
            f.write(json.dumps({"prompt": text}) + "\n")
    return ref, cur


def test_json_output_and_html_report_for_a_window_with_hotel_utterances(
    windows: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, cur = windows
    html = tmp_path / "report.html"
    rc = main(["drift", str(ref), str(cur), "--json", "--report", str(html), "--alpha", "0.01"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert data["drift"] is True
    assert data["threshold"] == 0.01 and data["p_value"] < 0.01
    assert data["n_reference"] == 120 and data["n_current"] == 90
    for key in ("score", "method", "explanation", "tests"):
        assert key in data
    assert data["explanation"]["prompt"]["novelty"]["rate"] > 0.1
    assert "Batches" in err  # the progress bar went to stderr, not into the JSON
    page = html.read_text(encoding="utf-8")
    assert "Drift detected" in page and page.count("<svg") >= 2
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # no external assets
    assert "<script" not in page
    hotel_example = data["explanation"]["prompt"]["novelty"]["examples"][0]["text"]
    from html import escape

    assert escape(hotel_example) in page


def test_plain_output_prints_the_verdict(
    windows: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    ref, _ = windows
    rc = main(["drift", str(ref), str(ref), "--no-progress", "--fail-on-drift"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("no drift: p=")
    assert "mmd" in out and "novelty" in out
    assert err == ""


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: d / "missing.jsonl", "no such file"),
        (lambda d: _write(d / "w.parquet", b"x"), "unknown input format '.parquet'"),
        (lambda d: _write(d / "w.txt", b"caf\xe9\n"), "not UTF-8"),
        (lambda d: _write(d / "w.csv", b"id\n1\n"), "no `text` or `prompt` column"),
        (lambda d: _write(d / "w.txt", b"\n"), "current window is empty"),
    ],
)
def test_bad_current_window_is_one_line_and_exit_code_2(
    windows: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make,
    expected: str,  # type: ignore[no-untyped-def]
) -> None:
    ref, _ = windows
    bad = make(tmp_path)
    rc = main(["drift", str(ref), str(bad)])
    _, err = capsys.readouterr()
    assert rc == 2
    assert expected in err and str(bad) in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_alpha_and_tiny_reference_are_refused(
    windows: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, cur = windows
    assert main(["drift", str(ref), str(cur), "--alpha", "1.5"]) == 2
    assert "--alpha" in capsys.readouterr().err
    tiny = _write(tmp_path / "tiny.txt", b"one\ntwo\n")
    assert main(["drift", str(tiny), str(cur), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "reference window has 2 texts" in err and err.count("\n") == 1


def test_the_installed_command_reports_bad_input_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "infersight.monitor.cli",
            "drift",
            str(tmp_path / "a.txt"),
            str(tmp_path / "b.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith("no such file") and "Traceback" not in done.stderr


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path
