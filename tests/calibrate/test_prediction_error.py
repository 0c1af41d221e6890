"""Prediction error bands (`perfcast.calibrate.prediction_error`): held-out ratio
quantiles per engine, the band's own held-out coverage, and where serve and validate
show them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from perfcast.calibrate import prediction_error as pe
from perfcast.calibrate.revision import CalibrationRevision
from perfcast.calibrate.store import default_revision
from perfcast.core.errors import ConfigError


def synthetic(n_vllm=1200, n_trtllm=12, sigma=0.2, seed=3):
    """Rows of 6 models; measured = predicted x lognormal(0, sigma) (vLLM) or x 1.5
    (TRT-LLM, too few rows for quantiles of its own)."""
    rng = np.random.default_rng(seed)
    rows, pred_t, pred_p, meas_t, meas_p = [], [], [], [], []
    for i in range(n_vllm + n_trtllm):
        backend = "vllm" if i < n_vllm else "trtllm"
        rows.append({"backend": backend, "model_path": f"m{i % 6}", "system": "h100_sxm"})
        t, p = rng.uniform(50, 2000), rng.uniform(5, 50)
        pred_t.append(t)
        pred_p.append(p)
        if backend == "vllm":
            meas_t.append(t * rng.lognormal(0, sigma))
            meas_p.append(p * rng.lognormal(0, sigma / 2))
        else:
            meas_t.append(1.5 * t)
            meas_p.append(1.5 * p)
    scheme = {"group_by": "model", "predictions": {"ttft": np.array(pred_t),
                                                   "tpot": np.array(pred_p)}}
    return rows, scheme, np.array(meas_t), np.array(meas_p)


def test_quantiles_per_engine_and_pooled_for_an_engine_with_few_rows():
    rows, scheme, mt, mp = synthetic()
    part = pe.fit_part(rows, scheme, mt, mp, np.ones(len(rows), bool), fitted_on={})
    v = part.values()
    from scipy.stats import norm

    # iid errors: p10-p90 holds about 80% of a held-out model's rows, so the levels are
    # 10 or the next wider one; lognormal(0, s): percentile q at exp(s x z_q)
    low_t, low_p = part.procedure["levels"]["ttft"][0], part.procedure["levels"]["tpot"][0]
    assert low_t in (10.0, 7.5) and low_p in (10.0, 7.5)
    z_t, z_p = norm.ppf(1 - low_t / 100), norm.ppf(1 - low_p / 100)
    assert v["serving.vllm.ttft_ratio_low"] == pytest.approx(np.exp(-z_t * 0.2), abs=0.04)
    assert v["serving.vllm.ttft_ratio_median"] == pytest.approx(1.0, abs=0.04)
    assert v["serving.vllm.ttft_ratio_high"] == pytest.approx(np.exp(z_t * 0.2), abs=0.05)
    assert v["serving.vllm.tpot_ratio_high"] == pytest.approx(np.exp(z_p * 0.1), abs=0.03)
    assert not any(n.startswith("serving.trtllm.") for n in v)   # 12 rows < MIN_ROWS
    assert "serving.pool.ttft_ratio_high" in v
    assert part.fitted_on["rows_per_backend"] == {"vllm": 1200}
    assert part.procedure["scheme"] == "model"


def test_the_band_holds_about_80_percent_of_held_out_groups_and_is_itself_held_out():
    rows, scheme, mt, mp = synthetic(n_trtllm=0)
    part = pe.fit_part(rows, scheme, mt, mp, np.ones(len(rows), bool), fitted_on={})
    cov = part.cv["coverage"]
    assert cov["rows"] == 1200 and len(cov["groups"]) == 6
    assert 0.72 <= cov["ttft"] <= 0.88 and 0.72 <= cov["tpot"] <= 0.88
    # a model whose errors are unlike the others': its band comes from the others only,
    # so none of its rows falls inside (were its own rows used, some would)
    mt = mt.copy()
    odd = np.array([r["model_path"] == "m0" for r in rows])
    mt[odd] = scheme["predictions"]["ttft"][odd] * 3.0
    part = pe.fit_part(rows, scheme, mt, mp, np.ones(len(rows), bool), fitted_on={})
    m0 = next(g for g in part.cv["coverage"]["groups"] if g["held_out"] == "m0")
    assert m0["ttft"] == 0.0 and m0["rows"] == 200


def test_the_levels_widen_until_held_out_models_are_covered():
    """Each model's errors have their own bias: pooled p10-p90 holds fewer than 80% of a
    held-out model's rows, so the band widens to the first level that does."""
    rows, scheme, mt, mp = synthetic(n_trtllm=0, sigma=0.1)
    bias = {f"m{i}": b for i, b in enumerate((0.7, 0.85, 1.0, 1.0, 1.2, 1.45))}
    mt = mt * np.array([bias[r["model_path"]] for r in rows])
    part = pe.fit_part(rows, scheme, mt, mp, np.ones(len(rows), bool), fitted_on={})
    low = part.procedure["levels"]["ttft"][0]
    assert low < 10.0
    narrow = pe.band_coverage(pe.row_groups(rows, "model"), [r["backend"] for r in rows],
                              {"ttft": mt, "tpot": mp}, scheme["predictions"],
                              np.ones(len(rows), bool), levels={"ttft": 10.0})
    assert narrow["ttft"] < 0.8
    assert part.cv["coverage"]["ttft"] >= 0.8 or low == pe.LEVELS[-1]


def test_too_few_rows_are_refused():
    rows, scheme, mt, mp = synthetic(n_vllm=10, n_trtllm=0)
    with pytest.raises(ConfigError, match="error bands need at least 20"):
        pe.fit_part(rows, scheme, mt, mp, np.ones(len(rows), bool), fitted_on={})


def banded_revision():
    """The shipped revision with a band part of known ratios."""
    rows, scheme, mt, mp = synthetic()
    part = pe.fit_part(rows, scheme, mt, mp, np.ones(len(rows), bool), fitted_on={})
    base = default_revision()
    parts = tuple(p for p in base.parts if p.name != pe.PART_NAME) + (part,)
    return CalibrationRevision(name="banded", code_version="test", parts=parts)


def test_a_band_is_the_prediction_times_the_ratio_quantiles():
    rev = banded_revision()
    values = rev.part(pe.PART_NAME).values()
    band = pe.prediction_band(rev, "vllm")
    assert band.engine == "vllm" and band.rows == 1200 and band.scheme == "model"
    got = band.apply("ttft", 200.0)
    assert got["low"] == pytest.approx(200.0 * values["serving.vllm.ttft_ratio_low"])
    assert got["high"] == pytest.approx(200.0 * values["serving.vllm.ttft_ratio_high"])
    assert pe.prediction_band(rev, "sglang").engine == pe.POOLED   # no rows of its own
    assert pe.prediction_band(None, "vllm") is None
    doc = pe.band_json(band, 200.0, 20.0)
    assert doc["tpot_ms"]["median"] == pytest.approx(
        20.0 * values["serving.vllm.tpot_ratio_median"])
    assert doc["held_out_coverage"] == {f"{m}_ms": rev.part(pe.PART_NAME).cv["coverage"][m]
                                        for m in ("ttft", "tpot")}
    assert "leave one model out" in doc["basis"]


def test_a_lent_revision_lends_no_band():
    from perfcast.calibrate.fit_serving import joined_parts

    rev = banded_revision()
    new = default_revision().part("serving_overheads")
    assert pe.PART_NAME not in {p.name for p in joined_parts(new, rev)}


def test_serve_and_validate_show_the_band(tmp_path):
    from perfcast.cli.main import app

    path = tmp_path / "rev.json"
    rev = banded_revision()
    path.write_text(json.dumps(rev.to_json()))
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl",
                                   "256", "--osl", "32", "--backend", "vllm", "--format",
                                   "json", "--calibration", str(path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    band = doc["prediction_band"]
    ratio = rev.part(pe.PART_NAME).values()["serving.vllm.ttft_ratio_high"]
    assert band["ttft_ms"]["high"] == pytest.approx(doc["ttft_ms"]["mean"] * ratio)
    text = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl",
                                    "256", "--osl", "32", "--backend", "vllm",
                                    "--calibration", str(path)])
    assert text.exit_code == 0 and "held-out error band of the mean" in text.output
    none = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4",
                                    "--isl", "256", "--osl", "32", "--format", "json",
                                    "--calibration", "none"])
    assert json.loads(none.output)["prediction_band"] is None


def test_validate_rows_carry_the_band_and_the_summary_its_coverage():
    from perfcast.cli.validate import attach_bands
    from perfcast.serving.silicon import RowResult, summarize

    rev = banded_revision()
    rows = [RowResult("a", "h100_sxm", "m", "vllm", "", "agg", 1, 1, 1, 100.0, 10.0, 100.0,
                      10.0),
            RowResult("b", "h100_sxm", "m", "vllm", "", "agg", 1, 1, 1, 300.0, 10.0, 100.0,
                      10.0),
            RowResult("c", "h100_sxm", "m", "vllm", "", "disagg", 1, 1, 1, 300.0, 10.0,
                      100.0, 10.0)]
    attach_bands(rows, rev)
    assert rows[0].prediction_band["engine"] == "vllm"
    assert rows[2].prediction_band is None            # bands are fitted on agg rows
    overall = summarize(rows[:2])[-1]
    assert overall["ttft_band_coverage"] == 0.5       # 300 ms lies above the high 1.3x
    assert overall["tpot_band_coverage"] == 1.0


def test_search_gives_agg_configurations_their_band(tmp_path):
    from perfcast.cli.main import app

    path = tmp_path / "rev.json"
    rev = banded_revision()
    path.write_text(json.dumps(rev.to_json()))
    res = CliRunner().invoke(app, ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", "--isl", "256",
                                   "--osl", "32", "--concurrency", "2,16", "--tp-sizes", "1,2",
                                   "--backend", "vllm", "--executor", "inline", "--format",
                                   "json", "--calibration", str(path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    ratio = rev.part(pe.PART_NAME).values()["serving.vllm.tpot_ratio_low"]
    agg = [c for c in out["top"] + out["pareto"] if c["mode"] == "agg"]
    assert agg
    for c in agg:
        assert c["prediction_band"]["tpot_ms"]["low"] == pytest.approx(
            c["metrics"]["tpot_ms"]["mean"] * ratio)
    # the bands were fitted on agg rows: disaggregated configurations get none
    assert all(c["prediction_band"] is None for c in out["top"] + out["pareto"]
               if c["mode"] == "disagg")


def test_validate_text_prints_the_share_inside_the_band(tmp_path):
    from pathlib import Path

    from perfcast.cli.main import app

    path = tmp_path / "rev.json"
    path.write_text(json.dumps(banded_revision().to_json()))
    rows = Path(__file__).parents[1] / "fixtures" / "silicon" / "h100_sxm_slice.csv"
    res = CliRunner().invoke(app, ["validate", "silicon", str(rows), "--calibration",
                                   str(path), "--workers", "1"],
                             env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    assert "TTFT in band" in res.output and "TPOT in band" in res.output


def test_calibrate_show_lists_the_band_coverage_per_held_out_group(tmp_path):
    from perfcast.cli.main import app

    path = tmp_path / "rev.json"
    rev = banded_revision()
    path.write_text(json.dumps(rev.to_json()))
    res = CliRunner().invoke(app, ["calibrate", "show", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "error band coverage:" in res.output
    for g in rev.part(pe.PART_NAME).cv["coverage"]["groups"]:
        assert g["held_out"] in res.output
