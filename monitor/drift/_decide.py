"""The verdict: every test on every field, Holm across all of them, effect floors applied.

This is the whole decision; the explanation never changes it.
"""

from __future__ import annotations

from ._config import DriftConfig
from ._holm import holm_adjust
from ._registry import get_test
from ._relevance_drop import relevance_drop_test
from ._results import TestResult
from ._stat import StatResult
from ._windows import EmbeddedWindow, TextWindow
from .errors import CurrentWindowEmpty, ReferenceWindowEmpty, WindowTooSmall

__all__ = ["FIELDS", "check_sizes", "deciding_test", "run_tests", "tested_fields"]

FIELDS = ("prompt", "response")


def tested_fields(reference: EmbeddedWindow, current: EmbeddedWindow, config: DriftConfig) -> tuple[str, ...]:
    """prompt always; response when both windows hold enough responses."""
    fields = ["prompt"]
    if len(reference.responses) >= config.min_reference and len(current.responses) >= config.min_current:
        fields.append("response")
    return tuple(fields)


def check_sizes(
    reference: EmbeddedWindow | TextWindow, current: EmbeddedWindow | TextWindow, config: DriftConfig
) -> None:
    """Window sizes (checked before anything is embedded, and again before testing)."""
    if len(reference.prompts) == 0:
        raise ReferenceWindowEmpty()
    if len(current.prompts) == 0:
        raise CurrentWindowEmpty()
    if len(reference.prompts) < config.min_reference:
        raise WindowTooSmall("reference", len(reference.prompts), config.min_reference)
    if len(current.prompts) < config.min_current:
        raise WindowTooSmall("current", len(current.prompts), config.min_current)


def run_tests(
    reference: EmbeddedWindow, current: EmbeddedWindow, config: DriftConfig
) -> tuple[TestResult, ...]:
    check_sizes(reference, current, config)
    raw: list[tuple[str, StatResult]] = []
    for name in tested_fields(reference, current, config):
        ref_rows = reference.field(name)[1]
        cur_rows = current.field(name)[1]
        for test in config.tests:
            raw.append((name, get_test(test)(ref_rows, cur_rows, config.options)))
    if config.relevance_test and "response" in tested_fields(reference, current, config):
        raw.append(("relevance", relevance_drop_test(reference.relevance, current.relevance, config.options)))
    adjusted = holm_adjust([r.p_value for _, r in raw])
    out = []
    for (field, r), p_adj in zip(raw, adjusted, strict=True):
        floor = config.floor(r.test)
        out.append(
            TestResult(
                field=field,
                test=r.test,
                method=r.method,
                statistic=float(r.statistic),
                score=float(r.score),
                effect_floor=floor,
                p_value=float(r.p_value),
                p_adjusted=float(p_adj),
                threshold=config.alpha,
                drifted=bool(p_adj < config.alpha and r.score >= floor),
                n_reference=r.n_reference,
                n_current=r.n_current,
                permutations=r.permutations,
            )
        )
    return tuple(out)


def deciding_test(tests: tuple[TestResult, ...]) -> TestResult:
    """The drifted test with the smallest adjusted p; if none drifted, the smallest adjusted p."""
    drifted = [t for t in tests if t.drifted]
    pool = drifted or list(tests)
    return min(pool, key=lambda t: (t.p_adjusted, -t.score))
