"""The serving-overheads fit: recovery of known parameters, fold rules, no leakage."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.calibrate import serving as cs
from perfcast.core.errors import ConfigError


def synthetic(n_per_backend: int = 80, noise: float = 0.03, seed: int = 1,
              truth: dict[str, float] | None = None):
    """Rows whose predictions are exactly linear in the parameters; the 'measured'
    values are that model at `truth` times log-normal noise."""
    rng = np.random.default_rng(seed)
    backends = ("sglang", "trtllm", "vllm")
    theta0, _ = cs.start_theta(backends)
    names = list(theta0)
    rows, bt, bp, dt, dp = [], [], [], [], []
    for b in backends:
        for i in range(n_per_backend):
            rows.append({"backend": b, "model_path": f"m{i % 4}", "system": "h100_sxm",
                         "silicon_data_source": f"camp{i % 2}; x"})
            bt.append(rng.uniform(50, 800))
            bp.append(rng.uniform(5, 40))
            gt, gp = np.zeros(len(names)), np.zeros(len(names))
            for j, n in enumerate(names):
                if n.split(".")[1] != b:
                    continue
                f = n.split(".")[2]
                # ms of TTFT / TPOT per us of each overhead, varied per row
                if f.startswith("frontend_overhead") or f.startswith("first_chunk"):
                    gt[j] = 1e-3 * rng.uniform(0.8, 1.2)
                elif f.startswith("frontend_request_service"):
                    gt[j] = 1e-3 * rng.uniform(0.0, 3.0)
                elif f.startswith("step_overhead"):
                    gp[j] = 1e-3 * rng.uniform(0.3, 1.0)
                    gt[j] = 1e-3 * rng.uniform(0.0, 2.0)
                elif f.startswith("per_request"):
                    gp[j] = 1e-3 * rng.uniform(4, 64)
                else:
                    gt[j] = 1e-3 * rng.uniform(50, 400)
                    gp[j] = 1e-3 * rng.uniform(0, 20)
            dt.append(gt)
            dp.append(gp)
    data = cs.LinearisedRows(rows, theta0, names, np.zeros(len(rows)), np.zeros(len(rows)),
                             np.array(bt), np.array(bp), np.array(dt), np.array(dp),
                             [""] * len(rows))
    truth = truth or {n: {"frontend_overhead": 30000.0, "first_chunk_overhead": 15000.0,
                          "frontend_request_service": 4000.0, "step_overhead": 1500.0,
                          "per_request_overhead": 40.0, "kernel_launch_eager": 9.0}[
                              n.split(".")[2][:-3]] for n in names}
    t, p = data.predict(np.array([truth[n] for n in names]))
    data.measured_ttft = t * np.exp(rng.normal(0, noise, len(t)))
    data.measured_tpot = p * np.exp(rng.normal(0, noise, len(p)))
    return data, truth


def linear_simulator(data, assignments):
    """Stand-in for the serving simulator: the rows' linear model (exact here)."""
    t, p = np.full(len(data.rows), np.nan), np.full(len(data.rows), np.nan)
    for idx, theta in assignments:
        tt, pp = data.predict(np.array([theta[n] for n in data.names]))
        t[idx], p[idx] = tt[idx], pp[idx]
    return t, p, [""] * len(data.rows)


def test_fit_recovers_known_parameters_within_their_reported_uncertainty():
    data, truth = synthetic()
    res = cs.fit(data, np.ones(len(data.rows), bool))
    checked = 0
    for name, value in truth.items():
        std = res.std[name]
        assert std is not None and std > 0, name
        # within 4 sigma (36 parameters: a 3-sigma miss is plausible by chance)
        assert abs(res.theta[name] - value) <= 4 * std, (name, res.theta[name], value, std)
        checked += 1
    assert checked == 18
    # and the reported sigmas are honest: not orders of magnitude wider than the errors
    z = [abs(res.theta[n] - v) / res.std[n] for n, v in truth.items()]
    assert np.median(z) > 0.05


def test_fit_refuses_too_few_rows():
    data, _ = synthetic(n_per_backend=5)
    with pytest.raises(ConfigError, match="at least 30"):
        cs.fit(data, np.ones(len(data.rows), bool))


def test_fold_with_too_few_held_out_rows_is_refused():
    data, _ = synthetic()
    data.rows[0]["model_path"] = "lonely"
    with pytest.raises(ConfigError, match="fold model='lonely' holds out 1"):
        cs.cross_validate(data, "model", simulate=linear_simulator)


def test_cross_validation_never_fits_on_its_held_out_rows():
    data, _ = synthetic()
    clean = cs.cross_validate(data, "model", simulate=linear_simulator)
    # plant wild measurements in model m0's rows: m0's own fold must not move at all
    planted = [i for i, r in enumerate(data.rows) if r["model_path"] == "m0"]
    data.measured_ttft[planted] *= 50.0
    data.measured_tpot[planted] *= 50.0
    dirty = cs.cross_validate(data, "model", simulate=linear_simulator)
    fold = {f["group"]: f for f in dirty["folds"]}
    base = {f["group"]: f for f in clean["folds"]}
    assert fold["m0"]["parameters"] == base["m0"]["parameters"]
    # ... while every fold that trains on the planted rows sees them
    assert fold["m1"]["parameters"] != base["m1"]["parameters"]
    assert fold["m0"]["held_out"]["ttft_mape"] > 10 * base["m0"]["held_out"]["ttft_mape"]


def test_backend_absent_from_training_gets_the_pooled_value():
    data, _ = synthetic()
    train = np.array([r["backend"] != "vllm" for r in data.rows])
    res = cs.fit(data, train)
    for f in ("frontend_overhead", "step_overhead"):
        assert res.theta[f"serving.vllm.{f}_us"] == pytest.approx(res.pool[f], rel=1e-3)


def test_fold_json_layout():
    data, _ = synthetic()
    cv = cs.cross_validate(data, "backend", simulate=linear_simulator)
    assert cv["group_by"] == "backend" and len(cv["folds"]) == 3
    f = cv["folds"][0]
    assert set(f) >= {"group", "rows", "in_sample", "held_out"}
    assert set(f["held_out"]) >= {"ttft_mape", "tpot_mape", "group"}
    assert cv["summary"]["held_out"]["rows"] == len(data.rows)


def test_overheads_mapping_is_in_seconds_per_backend():
    theta = {"serving.vllm.step_overhead_us": 1500.0, "serving.trtllm.frontend_overhead_us": 2e4}
    assert cs.theta_overheads(theta) == {"vllm": {"step_overhead_s": 1.5e-3},
                                         "trtllm": {"frontend_overhead_s": 0.02}}


def test_first_chunk_slopes_in_closed_form_match_the_simulator():
    # the simulator adds first-chunk time to TTFT only; the closed form must agree with a
    # finite difference of two real simulations
    from pathlib import Path

    from perfcast.serving.silicon import load_rules, read_rows, validate_rows
    here = Path(__file__).resolve()
    rows = read_rows(here.parents[1] / "fixtures" / "calibrate" / "silicon_small.csv")[-1:]
    configs = here.parents[3] / "shared" / "reference" / "model_configs"
    base, moved = (validate_rows(rows, configs_dir=configs,
                                 overheads={"trtllm": {"first_chunk_overhead_s": fc}})[0]
                   for fc in (0.0, 0.01))
    d_ttft = (moved.pred_ttft_ms - base.pred_ttft_ms) / 1e4     # ms per us
    d_tpot = (moved.pred_tpot_ms - base.pred_tpot_ms) / 1e4
    closed = cs._first_chunk_slopes(rows[0], float(load_rules()["harness"]["range_ratio"]))
    assert d_ttft == pytest.approx(closed[0], rel=1e-6)
    assert d_tpot == pytest.approx(closed[1], rel=0.02)


def test_both_residual_forms_recover_the_parameters_and_unknown_ones_are_refused():
    data, truth = synthetic(noise=0.01)
    for residual in ("log", "relative"):
        res = cs.fit(data, np.ones(len(data.rows), bool), cs.FitOptions(residual=residual))
        for name in ("serving.vllm.frontend_overhead_us", "serving.trtllm.step_overhead_us"):
            assert res.theta[name] == pytest.approx(truth[name], rel=0.1)
    with pytest.raises(ConfigError, match="unknown residual"):
        cs.fit(data, np.ones(len(data.rows), bool), cs.FitOptions(residual="squared"))


def test_a_whole_revision_lends_its_curves_not_its_serving_part():
    from perfcast.calibrate.fit_serving import joined_parts
    from perfcast.calibrate.store import default_revision

    shipped = default_revision()
    new = shipped.part("serving_overheads")
    parts = joined_parts(new, shipped)
    assert [p.name for p in parts] == ["serving_overheads", "analytic_efficiency"]
    assert parts[0] is new and parts[1] is shipped.part("analytic_efficiency")
    assert joined_parts(new, None) == (new,)
