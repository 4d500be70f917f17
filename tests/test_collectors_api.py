"""The public surface of infersight.collectors: `__all__` complete, errors as documented."""

from __future__ import annotations

import inspect

import infersight.collectors as collectors
from infersight.collectors import errors


def test_all_lists_every_public_name_and_nothing_missing() -> None:
    public = {
        n for n in vars(collectors) if not n.startswith("_") and not inspect.ismodule(getattr(collectors, n))
    }
    public -= {"annotations"}
    assert set(collectors.__all__) == public
    for name in collectors.__all__:
        assert hasattr(collectors, name)


def test_errors_module_draws_every_exception_in_its_tree() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.CollectorError)
        assert name in doc
    assert issubclass(errors.InvalidObservation, ValueError) and issubclass(
        errors.UnknownMetric, errors.InvalidQuery
    )
