"""Pins come from pyproject.toml; drift is warned about once, naming each package."""

from __future__ import annotations

import warnings

import pytest

from engine import versions


def test_pins_are_read_from_pyproject():
    assert versions.pinned_versions() == {
        "torch": "2.14.1",
        "transformers": "5.24.0",
        "onnx": "1.23.2",
        "onnxscript": "0.7.2",
        "onnxruntime": "1.32.0",
        "executorch": "1.5.1",
        "torchao": "0.18.0",
        "torchvision": "0.29.1",
        "timm": "1.0.31",
    }


def test_local_build_suffix_is_not_drift(monkeypatch):
    monkeypatch.setattr(versions, "installed_versions", lambda: {"torch": "2.14.1+cu130", "onnx": None})
    assert versions.version_drift() == {}


def test_drift_is_warned_once_with_pinned_and_installed(monkeypatch):
    monkeypatch.setattr(versions, "installed_versions", lambda: {"torch": "2.11.0+cu128", "transformers": "5.24.0"})
    monkeypatch.setattr(versions, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.warn_on_version_drift()
        versions.warn_on_version_drift()
    drift = [w for w in caught if issubclass(w.category, versions.VersionDriftWarning)]
    assert len(drift) == 1
    assert "torch 2.14.1 pinned, 2.11.0+cu128 installed" in str(drift[0].message)
    assert "transformers" not in str(drift[0].message)


@pytest.mark.parametrize("package", ["torch", "transformers"])
def test_this_environment_matches_the_pins(package):
    assert package not in versions.version_drift(), "the test install must use the pinned versions"
