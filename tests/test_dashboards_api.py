"""The public surface of infersight.dashboards is exactly what `__all__` lists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import infersight.dashboards as dashboards


def test_all_lists_every_public_name_and_only_existing_ones() -> None:
    public = {n for n in vars(dashboards) if not n.startswith("_") and n != "annotations"}
    assert set(dashboards.__all__) == public
    assert len(dashboards.__all__) == len(set(dashboards.__all__))


def test_every_exception_the_package_defines_derives_from_dashboard_error() -> None:
    defined = set()
    for info in pkgutil.iter_modules(dashboards.__path__):
        module = importlib.import_module(f"infersight.dashboards.{info.name}")
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, Exception)
                and value.__module__ == module.__name__
            ):
                defined.add(name)
    assert {"DashboardError", "GrafanaRejected"} <= defined
    from infersight.dashboards import _export

    for name in defined:  # one family; the package exports its base, the rest stay in `_export`
        assert issubclass(getattr(_export, name), dashboards.DashboardError), name
    assert defined & set(dashboards.__all__) == {"DashboardError"}


def test_private_modules_declare_all() -> None:
    for info in pkgutil.iter_modules(dashboards.__path__):
        module = importlib.import_module(f"infersight.dashboards.{info.name}")
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), (info.name, name)


def test_web_assets_dir_holds_the_page() -> None:
    assets = dashboards.web_assets_dir()
    assert {"index.html", "app.js", "style.css"} <= {p.name for p in assets.iterdir()}
