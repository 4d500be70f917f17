"""The public surface of the service and store packages is listed in `__all__`, completely."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = [
    "infersight.monitor.service",
    "infersight.monitor.service.demo",
    "infersight.monitor.store",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_every_public_name_and_only_existing_ones(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), "duplicates in __all__"
    assert all(hasattr(module, n) for n in exported)
    public = {
        n for n, v in vars(module).items()
        if not n.startswith("_") and not inspect.ismodule(v) and n != "annotations"
    }  # fmt: skip
    assert public <= exported, f"public but not in __all__: {sorted(public - exported)}"


def test_every_service_error_derives_from_service_error() -> None:
    from infersight.monitor.service import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ServiceError)
        assert name in errors.__doc__  # the docstring draws the tree
