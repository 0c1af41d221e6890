"""What the Evidence, Serve and API pages compute, checked by hand on the fixture slices
(no browser): heatmap counts, curves per selector combination, measured points answered
as measured, achieved rates from the work facts, the Pareto figure's points, the serve
options of a clicked configuration, the OpenAPI 3.0 form."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from perfcast.workbench import evidence_views as views
from perfcast.workbench import figures
from perfcast.workbench.state import Workbench


@pytest.fixture(scope="module")
def h100(stores):
    wb = Workbench(evidence_root=stores["root"] / "evidence")
    digest, db = wb.database(stores["snapshots"]["aiconfigurator:h100_sxm"])
    return wb, digest, db


def test_heatmap_counts_every_row_of_a_family_once(h100):
    _, _, db = h100
    h = views.heatmap(db)
    t = db.table
    gemm = t.filter(pc.and_(pc.equal(t["operation"], "gemm"), pc.equal(t["dtype"], "bf16")))
    row = h["counts"][h["families"].index("gemm bf16 (m)")]
    assert sum(row) == gemm.num_rows == 244
    # m = 1 lands in region 2^0, m = 32768 in 2^15
    ms = gemm["sel.int.m"].to_pylist()
    assert row[h["regions"].index(1)] == ms.count(1)
    assert row[h["regions"].index(32768)] == sum(32768 <= m < 65536 for m in ms)


def test_prefill_and_decode_attention_are_separate_curves(h100):
    _, _, db = h100
    curves = views.series(db, "attention", "bf16")
    prefill = [c for c in curves if c["key"]["phase"] == "prefill"]
    decode = [c for c in curves if c["key"]["phase"] == "decode"]
    assert prefill and decode
    assert all(c["key"]["q_tokens"] == "=kv_len" for c in prefill)
    assert all(c["key"]["q_tokens"] == "1" for c in decode)
    assert sum(c["points"] for c in curves) == 222


def test_gemm_curve_measured_points_and_predictions(h100):
    wb, digest, db = h100
    key = views.series(db, "gemm", "bf16")[0]["key"]
    c = views.curve(db, digest, "gemm", "bf16", key, wb.curve_resolvers(digest, "h100_sxm"))
    assert len(c["measured"]) == 74 and c["domain"] == [1, 32768]
    p = c["measured"][-1]
    # achieved TFLOP/s = 2 m n k / latency
    assert p["tflops"] == pytest.approx(2 * p["x"] * key["n"] * key["k"] / p["latency_s"] / 1e12)
    chain = {q["x"]: q for q in c["predicted"]["database + interpolation"]}
    measured = {q["x"]: q for q in c["measured"]}
    assert chain[1]["method"] == "measured"
    assert chain[1]["latency_s"] == pytest.approx(measured[1]["latency_s"])
    inside = [q for x, q in chain.items() if c["domain"][0] < x < c["domain"][1]]
    outside = [q for x, q in chain.items() if x > c["domain"][1]]
    assert {q["method"] for q in inside} <= {"measured", "interpolated"}
    assert {q["method"] for q in outside} == {"analytical"}
    assert {q["method"] for q in c["predicted"]["roofline"]} == {"analytical"}
    assert {q["method"] for q in c["predicted"]["calibrated"]} == {"calibrated"}
    from perfcast.hardware import load_system

    peak = load_system("h100_sxm").device.engine("matrix").peak_ops_per_s["bf16"] / 1e12
    assert max(q["tflops"] for q in c["predicted"]["roofline"]) <= peak + 1e-6


def test_neighbours_are_nearest_in_log_space(h100):
    _, _, db = h100
    spec = {"operation": "gemm", "dtype": "bf16", "runtime": "vllm", "runtime_version": "0.19.0",
            "implementation": "vllm_default", "dims": {"m": 100, "n": 4096, "k": 4096}}
    near = views.neighbours(db, spec, "h100_sxm", n=3)
    assert [n["dims"]["m"] for n in near] == [97, 96, 112]


SEARCH = {"inputs": {"model": "meta-llama/Llama-3.1-8B", "model_source": "x", "device": "h100_sxm",
                     "backend": "vllm", "backend_version": None, "isl": 256, "osl": 16,
                     "range_ratio": 0.8, "client": {"requests_per_client": 5}},
          "calibration": "none", "slo": {"max_tpot_ms": 50.0, "max_ttft_ms": None,
                                         "statistic": "mean"},
          "evaluated": 3, "meet_slo": 2,
          "configurations": [
              {"layout": "agg 2xtp1", "mode": "agg", "concurrency": 4, "pareto": True,
               "meets_slo": True, "tokens_per_s_per_gpu": 10.0, "tokens_per_s_per_user": 5.0},
              {"layout": "disagg P 1xtp2dp2 + D 3xtp1ep4", "mode": "disagg", "concurrency": 8,
               "pareto": False, "meets_slo": False, "tokens_per_s_per_gpu": 4.0,
               "tokens_per_s_per_user": 4.0},
              {"layout": "agg 1xtp2", "mode": "agg", "concurrency": 2, "pareto": False,
               "meets_slo": True, "tokens_per_s_per_gpu": None,
               "tokens_per_s_per_user": None}]}


def test_pareto_figure_points_index_the_configurations():
    fig = figures.pareto_figure(SEARCH)
    by_name = {t["name"]: t for t in fig["data"]}
    assert by_name["Pareto frontier"]["customdata"] == [0]
    assert by_name["misses an SLO"]["customdata"] == [1]
    assert by_name["meets the SLOs"]["customdata"] == []  # the third was not simulated
    assert fig["layout"]["shapes"][0]["x0"] == 1000.0 / 50.0  # TPOT 50 ms = 20 tok/s/user


def test_serve_options_of_a_disagg_configuration():
    args = figures.serve_args_for(SEARCH, SEARCH["configurations"][1])
    assert args["model"] == "meta-llama/Llama-3.1-8B"
    assert (args["tp_size"], args["dp_size"], args["ep_size"], args["workers"]) == (2, 2, 1, 1)
    assert (args["decode_tp_size"], args["decode_dp_size"], args["decode_ep_size"],
            args["decode_workers"]) == (1, 1, 4, 3)
    assert args["concurrency"] == 8 and args["num_requests"] == 40
    assert args["calibration"] == "none" and args["range_ratio"] == 0.8


def test_openapi_30_form():
    from perfcast.workbench.app import openapi_30

    doc = {"openapi": "3.1.0", "components": {"schemas": {"A": {"properties": {
        "x": {"anyOf": [{"type": "integer"}, {"type": "null"}], "examples": [1]},
        "y": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}}}}}}
    props = openapi_30(doc)["components"]["schemas"]["A"]["properties"]
    assert props["x"] == {"type": "integer", "nullable": True}
    assert props["y"] == {"anyOf": [{"type": "integer"}, {"type": "string"}],
                          "nullable": True}
    assert openapi_30(doc)["openapi"] == "3.0.3"
