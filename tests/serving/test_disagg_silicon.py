"""`validate silicon` on disagg rows: two pools from the row's prefill_* / decode_*
fields, a reason for rows without worker counts, and a summary per mode. The rows are
copied unchanged from the public silicon files (tests/fixtures/silicon/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.core.errors import ConfigError
from perfcast.serving.silicon import (ModelResolver, RowError, load_rules, read_rows,
                                      row_config, summarize_by_mode, validate_rows)
from perfcast.workload import ParallelPlan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "silicon"
ROWS = {r["id"]: r for r in read_rows(FIXTURES / "disagg_rows.csv")}
TP8_EP8 = "dsr1_h200_trtllm_fp8_disagg_1024x1024_c576_cfg303"
ADP8_EP8 = "dsr1_h200_trtllm_fp8_disagg_1024x1024_c1152_cfg321"
WIDE = "dsr1_h100_trtllm_fp8_disagg_1024x1024_c9_cfg494"
NO_COUNTS = ("2026_03_25_deepseek_r1_h100_sxm_sglang_fp8_disagg_1024x8192_c16_tp16_0_ep1_0_695",
             "2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c288_tp8_0_ep8_0_353")
BELOW_BOUND = "qwen3_32b_qwen3_32b_h100_sxm_vllm_disagg_4000x1000_c_tp_epnone_2"
SGLANG_DEP = "dsr1_h200_sglang_fp8_disagg_8192x1024_c128_cfg434"


def _config(row_id: str):
    rules = load_rules()
    return row_config(ROWS[row_id], ModelResolver(None, rules), rules)


def test_row_with_worker_counts_becomes_a_prefill_and_a_decode_pool():
    """prefill: 1 worker TP8 x EP8 (moe_tp 1); decode: 9 such workers of 64 requests:
    576 clients."""
    cfg, notes = _config(TP8_EP8)
    assert cfg.mode == "disagg"
    assert cfg.pool.workers == 1 and cfg.decode_pool.workers == 9
    assert cfg.pool.plan == ParallelPlan(tp=8, dp=1, ep=8, moe_tp=1)
    assert cfg.decode_pool.plan == ParallelPlan(tp=8, dp=1, ep=8, moe_tp=1)
    assert cfg.concurrency == 64 * 9
    assert not any("spans" in n for n in notes)


def test_decode_attention_dp_multiplies_the_concurrency():
    """decode_batch_size 16 x 9 workers x attention-DP 8 = 1,152 clients (the figure the
    harness's own label of this row records)."""
    cfg, _ = _config(ADP8_EP8)
    assert cfg.decode_pool.plan == ParallelPlan(tp=1, dp=8, ep=8, moe_tp=1)
    assert cfg.decode_pool.workers == 9
    assert cfg.concurrency == 1152


def test_a_fractional_decode_batch_size_gives_back_the_whole_concurrency():
    """C / (workers x attention-DP) need not be whole: 4,301 clients on one decode worker
    of 8 attention-DP ranks record 537.625; a product that is no whole number of clients
    is a reason."""
    rules = load_rules()
    row = {**ROWS[ADP8_EP8], "decode_num_workers": "1", "decode_batch_size": "537.625"}
    cfg, _ = row_config(row, ModelResolver(None, rules), rules)
    assert cfg.concurrency == 4301
    with pytest.raises(RowError, match="not a whole number of clients"):
        row_config({**row, "decode_batch_size": "537.6"}, ModelResolver(None, rules), rules)


def test_worker_wider_than_a_node_is_modelled_over_the_scale_out_tier():
    cfg, notes = _config(WIDE)
    assert cfg.pool.plan.num_devices == 16 and cfg.decode_pool.plan.num_devices == 16
    assert cfg.decode_pool.workers == 3 and cfg.concurrency == 3 * 3
    assert any("prefill worker spans 16 GPUs" in n and "infiniband" in n for n in notes)


@pytest.mark.parametrize("row_id", NO_COUNTS)
def test_row_without_worker_counts_gets_a_reason(row_id):
    with pytest.raises(RowError, match="lacks worker counts"):
        _config(row_id)
    (res,) = validate_rows([ROWS[row_id]])
    assert not res.predicted and res.has_worker_counts is False
    assert "prefill_num_workers, decode_num_workers, decode_batch_size" in res.reason


def test_missing_one_count_names_it():
    row = dict(ROWS[TP8_EP8], decode_num_workers="")
    with pytest.raises(RowError, match=r"\(decode_num_workers empty\)"):
        row_config(row, ModelResolver(None, load_rules()), load_rules())


def test_inconsistent_worker_layout_is_a_reason():
    row = dict(ROWS[TP8_EP8], decode_moe_tp_size="2.0")
    with pytest.raises(RowError, match="decode_moe_tp 2 x decode_moe_ep 8"):
        row_config(row, ModelResolver(None, load_rules()), load_rules())


def test_decode_pool_measurement_below_the_memory_bound_is_a_reason():
    """Qwen3-32B fp8, decode 2 workers x TP4 at 448 clients, 4,000-token prompts: the
    requests in decode need more HBM traffic per step than the measured 8.7 ms TPOT
    allows."""
    (res,) = validate_rows([ROWS[BELOW_BOUND]])
    assert not res.predicted and res.has_worker_counts is True
    assert "below" in res.reason and "contradicts" in res.reason


def test_summary_by_mode_keeps_agg_and_disagg_apart():
    agg = read_rows(FIXTURES / "h100_sxm_slice.csv")[:1]
    rows = agg + [ROWS[NO_COUNTS[0]], ROWS[BELOW_BOUND]]
    by_mode = summarize_by_mode(validate_rows(rows))
    assert set(by_mode) == {"agg", "disagg"}
    (agg_all,) = [g for g in by_mode["agg"] if g["model"] == "*"]
    (dis_all,) = [g for g in by_mode["disagg"] if g["model"] == "*"]
    assert agg_all["rows"] == 1 and "rows_with_worker_counts" not in agg_all
    assert dis_all["rows"] == 2 and dis_all["rows_with_worker_counts"] == 1
    assert dis_all["coverage_with_worker_counts"] == 0.0


def test_validate_json_has_a_disagg_summary(tmp_path):
    src = (FIXTURES / "disagg_rows.csv").read_text().splitlines()
    keep = (*NO_COUNTS, BELOW_BOUND, WIDE)
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("\n".join([src[0]] + [ln for ln in src[1:]
                                              if ln.split(",", 1)[0] in keep]) + "\n")
    out = tmp_path / "v.json"
    res = CliRunner().invoke(app, ["validate", "silicon", str(csv_file), "--mode", "disagg",
                                   "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert list(doc["summary_by_mode"]) == ["disagg"]
    (overall,) = [g for g in doc["summary_by_mode"]["disagg"] if g["model"] == "*"]
    assert overall["rows"] == 4 and overall["rows_with_worker_counts"] == 2
    assert overall["predicted"] == 1 and overall["coverage_with_worker_counts"] == 0.5
    assert overall["ttft_mape"] is not None and overall["tpot_mape"] is not None
    by_id = {r["row_id"]: r for r in doc["rows"]}
    assert by_id[WIDE]["pred_ttft_ms"] > 0
    assert all(by_id[i]["pred_ttft_ms"] is None for i in NO_COUNTS)


def test_deepseek_h100_disagg_rows_take_the_recipe_of_their_run():
    """InferenceX dsr1-fp8-h100-dynamo-trt runs one srt-slurm recipe per concurrency:
    9 clients on 1 prefill and 3 decode workers ran ctx1_gen3_tep16_batch2, decode
    max_batch_size 2 per worker; the prefill worker 2 requests and 2,048 tokens per
    rank."""
    cfg, notes = _config(WIDE)
    assert cfg.concurrency == 9 and cfg.decode_max_running_requests == 2
    assert cfg.backend.scheduler.token_budget == 2048
    assert cfg.backend.scheduler.max_running_requests == 2
    assert any("ctx1_gen3_tep16_batch2_eplb0_mtp0.yaml" in n for n in notes)
    rules = load_rules()
    models = ModelResolver(None, rules)
    # 8192/1024 with 154 clients on 2 decode workers: ctx1_gen2_tep16_batch64
    long = {**ROWS[WIDE], "isl": "8192", "decode_num_workers": "2", "decode_batch_size": "77"}
    cfg, _ = row_config(long, models, rules)
    assert cfg.concurrency == 154 and cfg.decode_max_running_requests == 64
    # a concurrency the search space does not run: the engine's defaults
    other, notes = row_config({**ROWS[WIDE], "decode_batch_size": "4"}, models, rules)
    assert other.concurrency == 12 and other.decode_max_running_requests is None
    assert not any("recipe" in n for n in notes)
    # 9 clients on one decode worker is another deployment than the recipe's
    other, _ = row_config({**ROWS[WIDE], "decode_num_workers": "1", "decode_batch_size": "9"},
                          models, rules)
    assert other.concurrency == 9 and other.decode_max_running_requests is None
    # the same deployment on another system or precision label: not this search space
    for change in ({"system": "h200_sxm"}, {"precision": "fp4"}):
        other, _ = row_config({**ROWS[WIDE], **change}, models, rules)
        assert other.decode_max_running_requests is None


def test_disagg_recipe_matches_every_field_of_a_run():
    from perfcast.serving.deploy import Pool
    from perfcast.serving.silicon_recipes import disagg_recipe
    harness = {"disagg_recipes": {"space": {
        "models": ["org/M"], "backend": "trtllm", "systems": ["b200_sxm"],
        "precision": ["fp4"], "source": "space source",
        "runs": [[1024, 1024, 6, 1, 3, False, 1, 2, 2048, "a.yaml"],
                 [1024, 1024, 512, 1, 1, True, 64, None, None, "b.yaml"]]}}}
    tep, dep = Pool(ParallelPlan(tp=8), 3), Pool(ParallelPlan(tp=1, dp=8), 1)
    prefill = Pool(ParallelPlan(tp=8), 1)

    def recipe(model="org/M", system="b200_sxm", label="fp4", lengths=(1024, 1024), conc=6,
               decode=tep):
        return disagg_recipe(harness, model, "trtllm", system, label, lengths, conc,
                             prefill, decode)

    assert recipe() == {"decode_max_batch_size": 1,
                        "scheduler": {"max_running_requests": 2, "token_budget": 2048},
                        "source": "space source; recipe a.yaml"}
    # prefill settings that differ between the recipe's versions are not set
    assert recipe(conc=512, decode=dep) == {"decode_max_batch_size": 64,
                                            "source": "space source; recipe b.yaml"}
    for changed in (dict(model="org/M-2"), dict(system="gb200"), dict(label="fp8"),
                    dict(lengths=(8192, 1024)), dict(conc=7), dict(conc=512),
                    dict(decode=Pool(ParallelPlan(tp=8), 2))):
        assert recipe(**changed) == {}, changed
    harness["disagg_recipes"]["space"]["runs"].append([1024, 1024, 9, 1, 3])
    with pytest.raises(ConfigError, match="5 fields"):
        recipe(conc=9)


def test_every_shipped_disagg_run_is_well_formed_and_unique():
    from perfcast.serving.silicon_recipes import DISAGG_RUN_FIELDS
    spaces = load_rules()["harness"]["disagg_recipes"]
    assert spaces
    for name, entry in spaces.items():
        assert entry["source"] and entry["models"] and entry["systems"], name
        keys = set()
        for launch in entry.get("launches") or ():
            from perfcast.serving.silicon_recipes import LAUNCH_KEYS
            assert set(launch) == set(LAUNCH_KEYS) and launch["recipe"], (name, launch)
            assert set(launch["decode"]) <= {"scheduler", "kv_cache", "cuda_graph"}
            assert set(launch["decode"].get("scheduler", {})) <= {"max_running_requests"}
            assert set(launch["prefill"]) <= {"scheduler", "kv_cache"}
        assert entry.get("runs") or entry.get("launches"), name
        for run in entry.get("runs") or ():
            assert len(run) == len(DISAGG_RUN_FIELDS), (name, run)
            r = dict(zip(DISAGG_RUN_FIELDS, run))
            assert r["decode_max_batch_size"] >= 1 and r["recipe"]
            key = (r["isl"], r["osl"], r["concurrency"], r["prefill_workers"],
                   r["decode_workers"], r["decode_attention_dp"])
            assert key not in keys, (name, key)   # one run per deployment
            keys.add(key)


def test_sglang_disagg_row_runs_each_role_with_its_launch_arguments():
    """InferenceX dsr1-fp8-h200-dynamo-sglang, recipe bs128-1p1d-dep: the prefill worker
    with --mem-fraction-static 0.75, 16 running requests and 163,840-token chunks; the
    decode worker (DP attention 8) with 0.88, CUDA graphs to 256 and 256 running
    requests, 32 per DP rank."""
    cfg, notes = _config(SGLANG_DEP)
    assert cfg.concurrency == 128
    prefill, decode = cfg.backend, cfg.decode_backend
    assert (prefill.kv_cache.memory_fraction, prefill.kv_cache.reserved_memory) == (0.75, None)
    assert (prefill.scheduler.max_running_requests, prefill.scheduler.token_budget) == (16, 163840)
    assert (decode.kv_cache.memory_fraction, decode.kv_cache.reserved_memory) == (0.88, None)
    assert decode.cuda_graph.max_batch == 256 and cfg.decode_max_running_requests == 32
    # the prefill launch's chunk does not reach the decode engine
    assert decode.scheduler.token_budget == 16384
    assert any("bs128-1p1d-dep.yaml" in n and "decode memory_fraction 0.88" in n for n in notes)
    # another client concurrency or layout is not this launch: SGLang's own fraction
    rules = load_rules()
    for change in ({"decode_batch_size": "4.0"},
                   {"decode_attention_dp_size": "4.0", "decode_moe_ep_size": "4.0"}):
        other, _ = row_config({**ROWS[SGLANG_DEP], **change}, ModelResolver(None, rules), rules)
        assert other.decode_backend is None and other.backend.kv_cache.reserved_memory


def test_decode_workers_run_the_decode_backend():
    from dataclasses import replace

    from perfcast.serving.deploy import run_serving
    cfg, _ = _config(SGLANG_DEP)
    cfg = replace(cfg, num_requests=16, concurrency=8)
    starved = replace(cfg.decode_backend,
                      kv_cache=cfg.decode_backend.kv_cache.with_memory_fraction(0.5))
    with pytest.raises(ConfigError, match="memory fraction 0.5"):
        run_serving(replace(cfg, decode_backend=starved))
    # and the prefill workers run `backend`
    with pytest.raises(ConfigError, match="memory fraction 0.5"):
        run_serving(replace(cfg, backend=replace(cfg.backend, kv_cache=starved.kv_cache)))
    assert run_serving(cfg).metrics.completed_requests == 16
