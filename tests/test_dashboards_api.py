"""The public surface of infersight.dashboards is exactly what `__all__` lists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import infersight.dashboards as dashboards


def test_all_lists_every_public_name_and_only_existing_ones() -> None:
    public = {n for n in vars(dashboards) if not n.startswith("_") and n not in {"annotations", "errors"}}
    assert set(dashboards.__all__) == public
    assert len(dashboards.__all__) == len(set(dashboards.__all__))


def test_every_exception_in_errors_is_exported_from_the_package() -> None:
    errors = importlib.import_module("infersight.dashboards.errors")
    classes = {n for n, v in vars(errors).items() if inspect.isclass(v) and issubclass(v, Exception)}
    assert classes <= set(dashboards.__all__)
    assert set(errors.__all__) == classes


def test_private_modules_declare_all() -> None:
    for info in pkgutil.iter_modules(dashboards.__path__):
        module = importlib.import_module(f"infersight.dashboards.{info.name}")
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), (info.name, name)


def test_web_assets_dir_holds_the_page() -> None:
    assets = dashboards.web_assets_dir()
    assert {"index.html", "app.js", "style.css"} <= {p.name for p in assets.iterdir()}
