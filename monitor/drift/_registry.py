"""The tests a detector can run on an embedded field, by name (an explicit dict)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ._mmd import mmd_test
from ._mmd_exact import mmd_exact_test
from ._mmd_rff import mmd_rff_test
from ._novelty import novelty_test
from ._stat import StatTest
from .errors import UnknownTest

__all__ = ["STAT_TESTS", "get_test"]

STAT_TESTS: Mapping[str, StatTest] = MappingProxyType(
    {
        "mmd": mmd_test,  # exact kernel or random features, by size
        "mmd_exact": mmd_exact_test,
        "mmd_rff": mmd_rff_test,
        "novelty": novelty_test,
    }
)


def get_test(name: str) -> StatTest:
    try:
        return STAT_TESTS[name]
    except KeyError:
        raise UnknownTest(name, tuple(sorted(STAT_TESTS))) from None
