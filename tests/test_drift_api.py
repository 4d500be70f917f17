"""The public surface of infersight.monitor.drift: complete, documented, importable without torch."""

from __future__ import annotations

import inspect
import subprocess
import sys

import infersight.monitor.drift as drift
from infersight.monitor.drift import errors
from infersight.monitor.drift._stat_tests import STAT_TESTS, get_test


def test_all_lists_every_public_name_and_only_existing_ones() -> None:
    public = {
        name
        for name, value in vars(drift).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name not in {"annotations"}
    }
    assert set(drift.__all__) == public
    assert len(drift.__all__) == len(set(drift.__all__))


def test_the_statistics_internals_are_not_exported() -> None:
    """The tests' functions are reached through the detector and `DetectorConfig.tests`;
    their modules (`_mmd`, `_stat_tests`, `_streaming`) keep them for tests and benchmarks."""
    internal = {"holm_adjust", "mmd_exact_test", "mmd_rff_test", "mmd_test", "novelty_test",
                "relevance_drop_test", "get_test", "run_tests", "design_cusum", "TailCusum"}  # fmt: skip
    assert not internal & set(drift.__all__)
    assert not internal & set(vars(drift))


def test_the_api_is_short_and_errors_stay_in_their_module() -> None:
    """What a user or the service calls; the explanation's parts and the specific errors are
    reached through a report and `drift.errors`."""
    assert len(drift.__all__) <= 30
    assert set(errors.__all__) & set(drift.__all__) == {"DriftError", "WindowError"}
    for name in ("DriftDetector", "DetectorConfig", "DriftReport", "read_window", "evaluate_window",
                 "StreamingDetector", "ReferencePolicy", "VersionPolicy", "length_drift"):  # fmt: skip
        assert name in drift.__all__


def test_errors_docstring_draws_every_exception_and_all_derive_from_drift_error() -> None:
    classes = [v for v in vars(errors).values() if inspect.isclass(v) and issubclass(v, Exception)]
    assert set(errors.__all__) == {c.__name__ for c in classes}
    for cls in classes:
        assert cls.__name__ in (errors.__doc__ or ""), cls.__name__
        assert issubclass(cls, errors.DriftError)


def test_package_and_schema_import_without_torch_or_sentence_transformers() -> None:
    code = (
        "import sys; import infersight.monitor.drift, infersight.monitor.store; "
        "bad = [m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_unknown_test_name_lists_the_valid_ones() -> None:
    try:
        get_test("ks")
    except errors.UnknownTest as exc:
        for name in STAT_TESTS:
            assert name in str(exc)
    else:  # pragma: no cover
        raise AssertionError("UnknownTest not raised")
