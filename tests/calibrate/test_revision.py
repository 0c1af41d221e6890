"""Calibration revisions: immutable, content-addressed, verified on load."""

from __future__ import annotations

import json

import pytest

from perfcast.calibrate import CalibrationRevision, CalibrationStore, FittedParameter, make_part
from perfcast.calibrate.store import load_calibration
from perfcast.core.errors import ConfigError


def revision(value: float = 1500.0) -> CalibrationRevision:
    p = FittedParameter(name="serving.vllm.step_overhead_us", value=value, unit="us",
                        lower=0.0, upper=20000.0, std=120.0, description="host time")
    part = make_part("serving_overheads", procedure={"name": "t", "version": 1, "options": {}},
                     parameters=[p], fitted_on={"observation_sets": ["sha256:" + "a" * 64]},
                     cv={"group_by": "model", "folds": [], "summary": {}})
    return CalibrationRevision(name="test", code_version="0.1.0", parts=(part,))


def test_round_trip_and_same_content_same_digest(tmp_path):
    store = CalibrationStore(tmp_path)
    rev = revision()
    digest = store.put(rev)
    assert digest == rev.digest == revision().digest
    assert store.put(revision()) == digest          # idempotent, nothing rewritten
    back = store.get(digest[7:19])
    assert back == rev and back.digest == digest
    assert revision(1600.0).digest != digest
    assert load_calibration(digest, store=store) == rev
    assert load_calibration("none", store=store) is None


def test_tampered_revision_is_refused(tmp_path):
    store = CalibrationStore(tmp_path)
    digest = store.put(revision())
    path = next((tmp_path / "revisions").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["parts"][0]["parameters"][0]["value"] = 1.0
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="changed after it was written"):
        store.get(digest)


def test_parameters_stay_inside_their_bounds():
    with pytest.raises(ConfigError, match="outside its bounds"):
        FittedParameter(name="x", value=-1.0, unit="us", lower=0.0, upper=1.0)


def test_unknown_revision_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="no calibration revision"):
        load_calibration("deadbeef", store=CalibrationStore(tmp_path))
