"""benchmarks/training_accuracy.py's calibration chain: on a device the shipped revision
has no records of (A100), the Vidur-fitted A100 revision first, then the transferred
H100/H200 curve for the sizes it leaves, instead of the shipped curves applied without
records; on H100 the shipped revision alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from perfcast.calibrate.store import default_revision, read_revision

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "training_accuracy", ROOT / "benchmarks" / "training_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a100_chain_is_the_fitted_curve_then_the_transfer(bench):
    fitted, transfer = (read_revision(p) for p in bench.DEVICE_REVISIONS)
    providers, _, note = bench.provider_chain("calibrated", "a100_sxm", bench.EVIDENCE_ROOT)
    assert [p.revision_digest for p in providers] == [fitted.digest, transfer.digest]
    assert providers[0].transfer is None and providers[1].transfer is not None
    assert "calibration_a100_vidur.json" in note
    # without device revisions: the shipped curves, applied without records of A100
    (shipped,), _, _ = bench.provider_chain("calibrated", "a100_sxm", bench.EVIDENCE_ROOT, ())
    assert shipped.revision_digest == default_revision().digest
    assert shipped.transfer["undeclared"]


def test_h100_uses_the_shipped_revision_only(bench):
    providers, _, _ = bench.provider_chain("calibrated", "h100_sxm", bench.EVIDENCE_ROOT)
    assert [p.revision_digest for p in providers] == [default_revision().digest]
