"""The disaggregated-handoff fit: recovery of a known handoff, fold rules, no leakage,
and the revision part reaching the simulator's overheads."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.calibrate import disagg_handoff as dh
from perfcast.core.errors import ConfigError

TRUTH_US = {"trtllm": 400_000.0, "sglang": 120_000.0}


def synthetic(n_per_backend: int = 24, noise: float = 0.03, seed: int = 3):
    """Rows whose measured TTFT is their base TTFT plus the backend's true handoff,
    times log-normal noise; TPOT is the base's."""
    rng = np.random.default_rng(seed)
    rows, base_t, base_p = [], [], []
    for b in TRUTH_US:
        for i in range(n_per_backend):
            rows.append({"backend": b, "model_path": f"org/m{i % 3}",
                         "system": "h100_sxm" if i % 2 else "h200_sxm",
                         "silicon_data_source": f"camp{i % 2}; x", "mode": "disagg"})
            base_t.append(rng.uniform(150, 3000))
            base_p.append(rng.uniform(8, 40))
    base_t, base_p = np.array(base_t), np.array(base_p)
    handoff_ms = np.array([TRUTH_US[r["backend"]] * 1e-3 for r in rows])
    meas_t = (base_t + handoff_ms) * np.exp(rng.normal(0, noise, len(rows)))
    meas_p = base_p * np.exp(rng.normal(0, noise, len(rows)))
    return dh.DisaggRows(rows, base_t, base_p, meas_t, meas_p, [""] * len(rows))


def additive_simulator(data: dh.DisaggRows):
    """The exact model of the synthetic rows: base + handoff, TPOT unchanged."""
    position = {id(r): i for i, r in enumerate(data.rows)}

    def simulate(rows, handoff_us):
        idx = [position[id(r)] for r in rows]
        t = data.base_ttft[idx] + 1e-3 * np.array(
            [handoff_us.get(r["backend"], 0.0) for r in rows])
        return t, data.base_tpot[idx].copy(), [""] * len(rows)

    return simulate


def test_a_fit_recovers_the_handoff_within_its_uncertainty():
    data = synthetic()
    res = dh.fit(data, data.usable)
    for backend, truth in TRUTH_US.items():
        name = dh.parameter_name(backend)
        assert res.std[name] is not None and res.std[name] > 0
        assert abs(res.theta[name] - truth) < 3 * res.std[name] + 0.02 * truth
    # vLLM has no rows: it gets the pool, which sits between the fitted backends
    pool = res.pool
    assert res.theta[dh.parameter_name("vllm")] == pytest.approx(pool, rel=1e-3)
    assert TRUTH_US["sglang"] < pool < TRUTH_US["trtllm"]
    assert res.backends_fitted == ["sglang", "trtllm"]


def test_the_handoff_stays_physical():
    data = synthetic()
    data.measured_ttft = data.base_ttft * 0.7       # every row faster than its base
    res = dh.fit(data, data.usable)
    assert all(v >= 0.0 for v in res.theta.values())
    assert res.theta[dh.parameter_name("trtllm")] == pytest.approx(0.0, abs=1.0)


def test_a_fit_refuses_too_few_rows_and_cv_lists_refused_folds():
    data = synthetic(n_per_backend=6)
    with pytest.raises(ConfigError, match="a handoff fit needs at least 10"):
        dh.fit(data, np.arange(len(data.rows)) < 5)
    cv = dh.cross_validate(data, "backend", additive_simulator(data))
    # holding out trtllm leaves 6 sglang rows for training: refused, with its reason
    assert {f["group"] for f in cv["refused"]} == {"sglang", "trtllm"}
    assert cv["folds"] == [] and cv["summary"]["held_out"]["rows"] == 0
    assert "training rows" in cv["refused"][0]["reason"]


def test_cv_never_lets_a_held_out_row_into_its_folds_fit():
    """A planted row whose TTFT implies a 1.3 s handoff changes the fit that sees it, not
    the fold that holds its system out."""
    data = synthetic()
    planted = dh.DisaggRows(
        [*data.rows, {"backend": "trtllm", "model_path": "org/m0", "system": "b300_sxm",
                      "silicon_data_source": "camp0; x", "mode": "disagg"}],
        np.append(data.base_ttft, 200.0), np.append(data.base_tpot, 10.0),
        np.append(data.measured_ttft, 1_500.0), np.append(data.measured_tpot, 10.0),
        [""] * (len(data.rows) + 1))
    # plain least squares, so the planted row would show in any fit that saw it
    options = dh.HandoffOptions(loss="linear", min_held_out_rows=1)
    planted_cv = dh.cross_validate(planted, "system", additive_simulator(planted), options)
    fold = {f["group"]: f for f in planted_cv["folds"]}["b300_sxm"]
    clean = dh.fit(data, data.usable, options)
    assert fold["parameters"] == {k: round(v, 3) for k, v in clean.theta.items()}
    assert fold["train_rows"] == int(data.usable.sum())
    with_it = dh.fit(planted, planted.usable, options)
    assert with_it.theta[dh.parameter_name("trtllm")] > \
        clean.theta[dh.parameter_name("trtllm")] + 10_000.0
    # the held-out row is simulated with the fold's handoff
    held = planted_cv["predictions"]["ttft"][-1]
    assert held == pytest.approx(200.0 + 1e-3 * clean.theta[dh.parameter_name("trtllm")])


def test_the_part_scores_in_sample_and_without_the_handoff():
    data = synthetic()
    sim = additive_simulator(data)
    cv = [dh.cross_validate(data, "system", sim)]
    part, res, (t, _) = dh.fit_part(data, fitted_on={"systems": ["h100_sxm", "h200_sxm"]},
                                    cv=cv, simulate=sim)
    assert part.name == dh.PART_NAME
    names = {p.name for p in part.parameters}
    assert names == {*(dh.parameter_name(b) for b in ("sglang", "trtllm", "vllm")),
                     "serving.pool.disagg_handoff_us"}
    summary = part.cv["summary"]
    assert summary["in_sample"]["ttft_mape"] < 0.05 < summary["without_handoff"]["ttft_mape"]
    assert summary["system"]["folds"] == 2
    assert part.fitted_on["rows"] == res.rows == len(data.rows)
    assert np.allclose(t, data.base_ttft + 1e-3 * np.array(
        [res.theta[dh.parameter_name(r["backend"])] for r in data.rows]))


def test_the_revisions_handoff_reaches_the_simulators_overheads():
    from perfcast.calibrate.revision import CalibrationRevision
    from perfcast.cli.calibration_option import all_overheads, backend_overheads

    data = synthetic()
    sim = additive_simulator(data)
    part, res, _ = dh.fit_part(data, fitted_on={}, cv=[], simulate=sim)
    rev = CalibrationRevision(name="t", code_version="test", parts=(part,))
    over = all_overheads(rev)
    assert over["trtllm"]["disagg_handoff_s"] == pytest.approx(
        res.theta[dh.parameter_name("trtllm")] * 1e-6, rel=1e-6)
    assert "pool" not in over
    assert backend_overheads(rev, "sglang") == {"disagg_handoff_s": pytest.approx(
        res.theta[dh.parameter_name("sglang")] * 1e-6, rel=1e-6)}


def test_only_disagg_rows_with_worker_counts_are_fitted():
    counts = {"prefill_num_workers": "1", "decode_num_workers": "2", "decode_batch_size": "8"}
    rows = [{"mode": "disagg", **counts}, {"mode": "agg", **counts},
            {"mode": "disagg", **counts, "decode_num_workers": ""}, {"mode": " disagg ", **counts}]
    assert dh.with_worker_counts(rows) == [rows[0], rows[3]]


def test_a_whole_revision_lends_no_stale_handoff():
    """A revision given for its efficiency curves keeps them; its handoff was fitted after
    overheads the new fit replaces, so it is left out."""
    from perfcast.calibrate.fit_serving import joined_parts
    from perfcast.calibrate.revision import CalibrationRevision
    from perfcast.calibrate.store import default_revision

    shipped = default_revision()
    data = synthetic()
    stale, _, _ = dh.fit_part(data, fitted_on={}, cv=[], simulate=additive_simulator(data))
    lender = CalibrationRevision(name="x", code_version="test",
                                 parts=(*shipped.parts, stale))
    new = shipped.part("serving_overheads")
    assert [p.name for p in joined_parts(new, lender)] == ["serving_overheads",
                                                           "analytic_efficiency"]
    fresh = joined_parts(new, lender, stale)
    assert [p.name for p in fresh] == ["serving_overheads", dh.PART_NAME,
                                       "analytic_efficiency"]
