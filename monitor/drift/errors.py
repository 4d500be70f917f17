"""Errors of the drift module. Each is named for what went wrong.

```
DriftError
├── InputError                  a window file cannot be read as texts
│   ├── InputFileNotFound       the path does not exist (or is not a file)
│   ├── UnknownInputFormat      the suffix is none of .jsonl, .csv, .txt
│   ├── InputNotUTF8            the bytes are not UTF-8 (file, byte offset)
│   ├── NoTextColumn            a CSV without a `text` or `prompt` column
│   └── BadRecord               a .jsonl line that is not an object with a string `prompt`
├── WindowError                 a window cannot be tested
│   ├── ReferenceWindowEmpty    the reference holds no text
│   ├── CurrentWindowEmpty      the current window holds no text
│   └── WindowTooSmall          fewer texts than the tests need (which window, how many)
├── UnknownTest                 a test name not in the registry (lists the valid ones)
├── EmbedderUnavailable         the Sentence-BERT model cannot be loaded (path, reason)
├── EmbeddingMismatch           arrays of the wrong shape or dimension reach a test
└── ReferenceNotFound           no stored reference of that name (and version / model version)
```
"""

from __future__ import annotations

__all__ = [
    "BadRecord",
    "CurrentWindowEmpty",
    "DriftError",
    "EmbedderUnavailable",
    "EmbeddingMismatch",
    "InputError",
    "InputFileNotFound",
    "InputNotUTF8",
    "NoTextColumn",
    "ReferenceNotFound",
    "ReferenceWindowEmpty",
    "UnknownInputFormat",
    "UnknownTest",
    "WindowError",
    "WindowTooSmall",
]


class DriftError(Exception):
    """Base of every error raised by `infersight.monitor.drift`."""


class InputError(DriftError):
    """A window file cannot be read as texts; `path` names it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class InputFileNotFound(InputError):
    def __init__(self, path: str) -> None:
        super().__init__(path, "no such file")


class UnknownInputFormat(InputError):
    def __init__(self, path: str, suffix: str, valid: tuple[str, ...]) -> None:
        shown = suffix or "(no suffix)"
        super().__init__(path, f"unknown input format {shown!r}: expected one of {', '.join(valid)}")


class InputNotUTF8(InputError):
    def __init__(self, path: str, offset: int) -> None:
        super().__init__(path, f"not UTF-8 text (first bad byte at offset {offset})")
        self.offset = offset


class NoTextColumn(InputError):
    def __init__(self, path: str, columns: tuple[str, ...]) -> None:
        found = ", ".join(columns) if columns else "none"
        super().__init__(path, f"no `text` or `prompt` column (columns found: {found})")
        self.columns = columns


class BadRecord(InputError):
    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(path, f"line {line}: {reason}")
        self.line = line


class WindowError(DriftError):
    """A window cannot be tested."""


class ReferenceWindowEmpty(WindowError):
    def __init__(self, where: str = "") -> None:
        super().__init__(f"reference window is empty{f' ({where})' if where else ''}")


class CurrentWindowEmpty(WindowError):
    def __init__(self, where: str = "") -> None:
        super().__init__(f"current window is empty{f' ({where})' if where else ''}")


class WindowTooSmall(WindowError):
    def __init__(self, window: str, n: int, minimum: int) -> None:
        super().__init__(f"{window} window has {n} texts; the drift tests need at least {minimum}")
        self.window = window
        self.n = n
        self.minimum = minimum


class UnknownTest(DriftError):
    def __init__(self, name: str, valid: tuple[str, ...]) -> None:
        super().__init__(f"unknown drift test {name!r}: valid tests are {', '.join(valid)}")
        self.name = name
        self.valid = valid


class EmbedderUnavailable(DriftError):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot load the Sentence-BERT model at {path}: {reason}")
        self.path = path


class EmbeddingMismatch(DriftError):
    """Arrays that are not [N, D] float embeddings of one dimension reached a test."""


class ReferenceNotFound(DriftError):
    def __init__(self, what: str) -> None:
        super().__init__(f"no stored drift reference {what}")
