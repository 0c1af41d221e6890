"""`validate silicon`: rows become deployments; bad rows get reasons, never numbers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.evidence.versions import nearest_version, version_key
from perfcast.serving.silicon_bounds import closed_loop_in_decode, ttft_in_completion_gaps
from perfcast.serving.silicon import (ModelResolver, RowError, load_rules, read_rows, row_config,
                                      summarize, validate_rows)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "silicon" / "h100_sxm_slice.csv"


@pytest.fixture(scope="module")
def results():
    return validate_rows(read_rows(FIXTURE))


def test_modelled_rows_are_predicted_and_agree_with_measurement(results):
    by_model = {r.model: r for r in results if r.predicted}
    assert len(by_model) == 2  # Llama-3.1-8B (x2 rows) and Llama-3.1-70B
    for r in results:
        if r.predicted:
            assert r.pred_ttft_ms > 0 and r.pred_tpot_ms > 0
            # analytic costs only (roofline kernels are 20-60% off): decode speed
            # within 40% of the measured deployment
            assert abs(r.pred_tpot_ms / r.measured_tpot_ms - 1) < 0.4
    llama8 = [r for r in results if "8B" in r.model]
    assert llama8[0].assumptions and "Llama-3.1-8B" in llama8[0].assumptions[0]


def test_bad_rows_get_reasons(results):
    reasons = {r.row_id: r.reason for r in results if not r.predicted}
    assert any("exceeds one 8-GPU node" in v for v in reasons.values())
    assert any("worker counts" in v for v in reasons.values())
    for r in results:
        assert r.predicted != bool(r.reason)


def test_unknown_model_and_broken_fields_are_reported():
    row = read_rows(FIXTURE)[0]
    rows = [dict(row, model_path="acme/NoSuchModel-7B"), dict(row, silicon_tpot_ms=""),
            dict(row, isl="abc"), dict(row, backend="tgi"),
            dict(row, backend="trtllm", backend_version="1.2.0rc6.post3")]
    out = validate_rows(rows)
    assert [r.predicted for r in out] == [False] * 5
    assert "no config.json" in out[0].reason
    assert "silicon_tpot_ms" in out[1].reason
    assert "'isl' is not a number" in out[2].reason
    assert "unknown backend" in out[3].reason
    assert "MTP" in out[4].reason


def test_unsupported_architecture_is_a_reason(tmp_path):
    cfg = {"model_type": "mamba", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 100}
    (tmp_path / "acme--Snake-1B_config.json").write_text(json.dumps(cfg))
    row = dict(read_rows(FIXTURE)[0], model_path="acme/Snake-1B")
    (res,) = validate_rows([row], configs_dir=tmp_path)
    assert not res.predicted and "mamba" in res.reason


def test_summary_reports_coverage_and_mape(results):
    overall = [g for g in summarize(results) if g["model"] == "*"][0]
    assert overall["rows"] == 5 and overall["predicted"] == 3
    assert overall["coverage"] == pytest.approx(0.6)
    assert 0 <= overall["tpot_mape"] < 0.4


def test_cli_csv_has_one_row_per_id_with_reasons(tmp_path):
    out = tmp_path / "pred.csv"
    res = CliRunner().invoke(app, ["validate", "silicon", str(FIXTURE), "--format", "csv",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open()))
    assert [r["id"] for r in rows] == [r["id"] for r in read_rows(FIXTURE)]
    for r in rows:
        assert bool(r["pred_ttft_ms"]) == bool(r["pred_tpot_ms"]) == (not r["reason"])


def test_versions_order_and_nearest_choice():
    assert version_key("1.2.0rc5") < version_key("1.2.0") < version_key("1.2.0.post1")
    assert version_key("0.5.6.post2") < version_key("0.5.9") < version_key("0.5.10")
    avail = ["1.2.0rc5", "1.3.0rc10", "1.3.0rc20"]
    assert nearest_version("1.3.0rc15", avail) == "1.3.0rc10"
    assert nearest_version("1.0.0rc3", avail) == "1.2.0rc5"
    assert nearest_version("", avail) == "1.3.0rc20"
    # nearest release, not the newest older one: 0.18 is one minor release from 0.19,
    # four from 0.14; a release candidate of 1.3.0 is measured by another 1.3.0 rc
    vllm = ["0.14.0", "0.19.0", "0.22.0", "0.24.0"]
    assert nearest_version("0.18.0", vllm) == "0.19.0"
    assert nearest_version("0.12.0", vllm) == "0.14.0"
    assert nearest_version("0.11.2", ["0.10.0", "0.14.0"]) == "0.10.0"  # tie -> older
    assert nearest_version("1.3.0rc1", ["1.2.0rc5", "1.3.0rc10", "1.3.0rc15"]) == "1.3.0rc10"
    assert nearest_version("0.5.8.post1", ["0.5.6.post2", "0.5.9", "0.5.10"]) == "0.5.9"


def _agg_row(**changes):
    row = {"id": "x", "backend": "trtllm", "backend_version": "1.0.0rc3",
           "model_path": "meta-llama/Llama-3.1-8B", "system": "h100_sxm", "precision": "bf16",
           "mode": "agg", "isl": "1000", "osl": "100", "gemm_quant_mode": "bf16",
           "moe_quant_mode": "", "batch_size": "48", "tp_size": "4", "pp_size": "1",
           "attention_dp_size": "", "moe_tp_size": "4", "moe_ep_size": "1",
           "silicon_data_source": "silicon_concurrency=192", "silicon_ttft_ms": "1",
           "silicon_tpot_ms": "1"}
    row.update(changes)
    rules = load_rules()
    return row_config(row, ModelResolver(None, rules), rules)


def test_layout_and_concurrency_come_from_the_layout_fields_only():
    # agg concurrency = batch_size x attention-DP (reference README); provenance text
    # such as silicon_data_source never changes the layout or the client count
    cfg, notes = _agg_row()
    assert (cfg.pool.plan.tp, cfg.pool.plan.dp, cfg.concurrency) == (4, 1, 48)
    cfg2, _ = _agg_row(silicon_data_source="source_file=x.csv; silicon_concurrency=512")
    assert (cfg2.pool.plan.tp, cfg2.pool.plan.dp, cfg2.concurrency) == (4, 1, 48)
    assert cfg2.backend == cfg.backend and cfg2.range_ratio == cfg.range_ratio
    cfg, _ = _agg_row(attention_dp_size="2", tp_size="2", moe_tp_size="2")
    assert (cfg.pool.plan.tp, cfg.pool.plan.dp, cfg.concurrency) == (2, 2, 96)


def test_an_expert_layout_wider_than_the_attention_layout_is_inconsistent():
    # moe_tp x moe_ep must span the tp x attention-DP GPUs; a MoE TP of 2 on a one-GPU
    # layout (a public H200 Qwen3-235B-A22B-FP8 row) gets that reason, not a guess
    from perfcast.serving.silicon import RowError
    moe = dict(model_path="Qwen/Qwen3-30B-A3B", backend="vllm", backend_version="0.12.0")
    with pytest.raises(RowError, match="moe_tp 2 x moe_ep 1 != tp 1 x attention-dp 1"):
        _agg_row(tp_size="1", moe_tp_size="2", **moe)
    with pytest.raises(RowError, match="moe_tp 4 x moe_ep 1 != tp 2"):
        _agg_row(tp_size="2", moe_tp_size="4", **moe)
    # moe_tp 1, unset or matching, and a dense model's filler of any value, are fine
    for kw in (dict(moe_tp_size="1", **moe), dict(moe_tp_size="", **moe),
               dict(moe_tp_size="4", **moe), dict(tp_size="2", moe_tp_size="4")):
        cfg, _ = _agg_row(**kw)
        assert cfg.pool.plan.tp == int(kw.get("tp_size", 4))


def test_client_in_flight_must_not_be_negative():
    from perfcast.core.errors import ConfigError
    from perfcast.serving.backends import SchedulerConfig
    with pytest.raises(ConfigError, match="client_in_flight"):
        SchedulerConfig(client_in_flight=-1)


def test_vllm_token_budget_follows_the_harness_recipe_of_the_exact_model_id():
    # harness: vLLM max-num-batched-tokens 8192, 2 x isl for MiniMax-M2.5 (exact id)
    import copy
    kw = dict(backend="vllm", backend_version="0.18.0", batch_size="8", tp_size="1",
              moe_tp_size="1", attention_dp_size="1", silicon_data_source="", isl="8192")
    cfg, _ = _agg_row(**kw)
    assert cfg.backend.scheduler.token_budget == 8192
    rules = copy.deepcopy(load_rules())
    recipe = {"vllm": [{"token_budget_isl_multiple": 2, "source": "test recipe"}]}
    rules["harness"]["model_recipes"] = {"meta-llama/Llama-3.1-8B": recipe}
    row = {"id": "x", "model_path": "meta-llama/Llama-3.1-8B", "system": "h100_sxm",
           "precision": "bf16", "mode": "agg", "osl": "100", "gemm_quant_mode": "bf16",
           "moe_quant_mode": "", "pp_size": "1", "moe_ep_size": "1", "silicon_ttft_ms": "1",
           "silicon_tpot_ms": "1", **kw}
    cfg, notes = row_config(row, ModelResolver(None, rules), rules)
    assert cfg.backend.scheduler.token_budget == 16384
    assert any("2 x isl (test recipe)" in n for n in notes)
    # a longer id that merely contains the recipe's id gets nothing
    rules["harness"]["model_recipes"] = {"meta-llama/Llama-3.1-8": recipe}
    cfg, _ = row_config(row, ModelResolver(None, rules), rules)
    assert cfg.backend.scheduler.token_budget == 8192


def test_harness_recipe_entries_apply_by_exact_id_system_attention_dp_and_lengths():
    from perfcast.serving.silicon_recipes import harness_recipe
    harness = {"model_recipes": {"org/M": {"trtllm": [
        {"scheduler": {"token_budget": 100}, "kv_cache": {"memory_fraction": 0.5},
         "source": "base"},
        {"systems": ["h200_sxm"], "attention_dp": True,
         "scheduler": {"attention_dp_balance": True}, "source": "adp"},
        {"lengths": [1024, 1024], "scheduler": {"token_budget": 200}, "source": "1k1k"},
    ]}}}
    got = harness_recipe(harness, "org/M", "trtllm", "h200_sxm", attention_dp=True,
                         lengths=(1024, 1024))
    assert got == {"scheduler": {"token_budget": 200, "attention_dp_balance": True},
                   "kv_cache": {"memory_fraction": 0.5}, "source": "1k1k"}
    got = harness_recipe(harness, "org/M", "trtllm", "h100_sxm", attention_dp=True,
                         lengths=(8192, 1024))
    assert got == {"scheduler": {"token_budget": 100}, "kv_cache": {"memory_fraction": 0.5},
                   "source": "base"}
    got = harness_recipe(harness, "org/M", "trtllm", "h200_sxm", attention_dp=False,
                         lengths=(8192, 1024))
    assert "attention_dp_balance" not in got["scheduler"]
    assert harness_recipe(harness, "org/M", "vllm", "h200_sxm", attention_dp=False,
                          lengths=(1, 1)) == {}
    assert harness_recipe(harness, "org/M-2", "trtllm", "h200_sxm", attention_dp=False,
                          lengths=(1, 1)) == {}


def test_harness_recipe_entries_apply_by_tensor_parallel_size_and_precision_label():
    from perfcast.serving.silicon_recipes import harness_recipe
    harness = {"model_recipes": {"org/M": {"sglang": [
        {"tp": [8], "scheduler": {"max_running_requests": 128}, "source": "tp8"},
        {"tp": [4], "scheduler": {"max_running_requests": 32}, "source": "tp4"},
        {"precision": ["fp4"], "kv_cache": {"memory_fraction": 0.9}, "source": "fp4"},
    ]}}}

    def recipe(tp, precision):
        return harness_recipe(harness, "org/M", "sglang", "b200_sxm", attention_dp=False,
                              lengths=(8192, 1024), tp=tp, precision=precision)

    assert recipe(8, "fp8") == {"scheduler": {"max_running_requests": 128}, "source": "tp8"}
    assert recipe(4, "fp4") == {"scheduler": {"max_running_requests": 32},
                                "kv_cache": {"memory_fraction": 0.9}, "source": "fp4"}
    assert recipe(2, "fp8") == {}
    # a caller that gives no layout or label matches no entry that names one
    assert harness_recipe(harness, "org/M", "sglang", "b200_sxm", attention_dp=False,
                          lengths=(8192, 1024)) == {}


def test_deepseek_r1_trtllm_h200_attention_dp_rows_run_the_recipes_balance():
    # InferenceX dsr1_fp8_h200_trt: attention_dp_config enable_balance, timeout_iters 60,
    # batching_wait_iters 0, only when the layout has attention DP
    rules = load_rules()
    base = {"id": "x", "model_path": "deepseek-ai/DeepSeek-R1", "system": "h200_sxm",
            "backend": "trtllm", "backend_version": "1.1.0rc2.post2", "precision": "fp8",
            "mode": "agg", "isl": "8192", "osl": "1024", "gemm_quant_mode": "fp8_block",
            "moe_quant_mode": "fp8_block", "pp_size": "1",
            "moe_tp_size": "1", "moe_ep_size": "8", "silicon_ttft_ms": "1",
            "silicon_tpot_ms": "1", "silicon_data_source": ""}
    adp = {**base, "batch_size": "16", "tp_size": "1", "attention_dp_size": "8"}
    cfg, notes = row_config(adp, ModelResolver(None, rules), rules)
    sched = cfg.backend.scheduler
    assert (sched.attention_dp_balance, sched.attention_dp_timeout_iters,
            sched.attention_dp_batching_wait_iters) == (True, 60, 0)
    assert any("dsr1_fp8_h200_trt" in n for n in notes)
    assert cfg.backend.kv_cache.memory_fraction == 0.75   # the script's KV fraction
    cfg, _ = row_config({**base, "batch_size": "16", "tp_size": "8", "attention_dp_size": "1"},
                        ModelResolver(None, rules), rules)
    assert cfg.backend.scheduler.attention_dp_balance is False
    assert cfg.backend.kv_cache.memory_fraction == 0.75   # with or without attention DP
    cfg, _ = row_config({**adp, "system": "h100_sxm"}, ModelResolver(None, rules), rules)
    assert cfg.backend.scheduler.attention_dp_balance is False
    # disagg rows ran other launch scripts: not the agg script's settings
    disagg = {**base, "mode": "disagg", "prefill_num_workers": "1", "decode_num_workers": "1",
              "decode_batch_size": "16", "prefill_tp_size": "8", "prefill_pp_size": "1",
              "prefill_attention_dp_size": "1", "prefill_moe_tp_size": "1",
              "prefill_moe_ep_size": "8", "decode_tp_size": "1", "decode_pp_size": "1",
              "decode_attention_dp_size": "8", "decode_moe_tp_size": "1",
              "decode_moe_ep_size": "8", "batch_size": "", "tp_size": "", "attention_dp_size": ""}
    cfg, notes = row_config(disagg, ModelResolver(None, rules), rules)
    assert cfg.decode_pool.plan.dp == 8
    assert cfg.backend.scheduler.attention_dp_balance is False
    assert not any("dsr1_fp8_h200_trt" in n for n in notes)
    # but the multi-node recipe of its run (128 clients, 1 + 1 workers, 8,192 tokens)
    assert cfg.decode_max_running_requests == 256
    assert any("c128_ctx1_gen1_dep8_batch256" in n for n in notes)


def deepseek_r1_agg_row(**fields) -> dict:
    """A DeepSeek-R1 fp8 agg row at TP 8, 8192/1024, with `fields` changed."""
    row = {"id": "x", "model_path": "deepseek-ai/DeepSeek-R1", "precision": "fp8",
           "mode": "agg", "isl": "8192", "osl": "1024", "gemm_quant_mode": "fp8_block",
           "moe_quant_mode": "fp8_block", "pp_size": "1", "tp_size": "8",
           "attention_dp_size": "1", "moe_tp_size": "8", "moe_ep_size": "1",
           "silicon_ttft_ms": "1", "silicon_tpot_ms": "1", "silicon_data_source": ""}
    return {**row, **fields}


def test_blackwell_recipes_apply_to_their_system_precision_layout_and_lengths():
    # the InferenceX B200/B300 launch scripts' settings that stayed the same over their
    # history (silicon_rules.yaml cites each script)
    rules = load_rules()
    models = ModelResolver(None, rules)
    base = deepseek_r1_agg_row(system="b200_sxm", backend="trtllm",
                               backend_version="1.3.0rc14", batch_size="64")
    cfg, notes = row_config(base, models, rules)
    assert cfg.backend.kv_cache.memory_fraction == 0.8
    assert any("dsr1_fp8_b200_trt" in n for n in notes)
    # TP 4 at 8192/1024 changed over the script's history: no recipe, the engine default
    cfg, _ = row_config({**base, "tp_size": "4", "moe_tp_size": "4"}, models, rules)
    default = row_config({**base, "system": "h100_sxm"}, models, rules)[0]
    assert cfg.backend.kv_cache.memory_fraction == default.backend.kv_cache.memory_fraction
    # the fp4 checkpoint's script is another launch
    cfg, _ = row_config({**base, "precision": "fp4", "gemm_quant_mode": "nvfp4",
                         "moe_quant_mode": "nvfp4"}, models, rules)
    assert cfg.backend.kv_cache.memory_fraction != 0.8
    # attention DP: the balance settings of both DeepSeek-R1 scripts
    adp = {**base, "batch_size": "16", "tp_size": "1", "attention_dp_size": "8",
           "moe_tp_size": "1", "moe_ep_size": "8"}
    for precision in ("fp8", "fp4"):
        cfg, _ = row_config({**adp, "precision": precision}, models, rules)
        sched = cfg.backend.scheduler
        assert (sched.attention_dp_balance, sched.attention_dp_timeout_iters,
                sched.attention_dp_batching_wait_iters) == (True, 60, 0)
    gptoss = {**base, "model_path": "openai/gpt-oss-120b", "precision": "fp4",
              "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4", "tp_size": "2",
              "moe_tp_size": "2", "isl": "1024", "osl": "1024"}
    cfg, _ = row_config(gptoss, models, rules)
    assert cfg.backend.scheduler.token_budget == 20000
    assert cfg.backend.scheduler.max_running_requests == 512
    assert cfg.backend.kv_cache.memory_fraction == 0.85
    # its vLLM script: --max-num-seqs 512; the same row on H200 keeps vLLM's default
    vllm = {**gptoss, "backend": "vllm", "backend_version": "0.15.0"}
    assert row_config(vllm, models, rules)[0].backend.scheduler.max_running_requests == 512
    h200 = row_config({**vllm, "system": "h200_sxm"}, models, rules)[0]
    assert h200.backend.scheduler.max_running_requests != 512
    kimi = {**base, "model_path": "moonshotai/Kimi-K2.5", "backend": "vllm",
            "backend_version": "0.24.0", "precision": "int4", "gemm_quant_mode": "int4_wo",
            "moe_quant_mode": "int4_wo", "system": "b300_sxm"}
    configs = Path(__file__).resolve().parents[3] / "shared" / "reference" / "model_configs"
    cfg, _ = row_config(kimi, ModelResolver(configs, rules), rules)
    assert cfg.backend.kv_cache.memory_fraction == 0.95
    sglang = {**base, "backend": "sglang", "backend_version": "0.5.9"}
    cfg, _ = row_config(sglang, models, rules)
    sched = cfg.backend.scheduler
    assert (sched.token_budget, sched.max_running_requests) == (32768, 128)
    assert cfg.backend.kv_cache.memory_fraction == 0.82
    assert cfg.precision.kv_cache == "fp8"      # the script's fp8_e4m3, as the label says
    # TP 4 took the TP 8 values until its branch was added: changed, not applied
    cfg, notes = row_config({**sglang, "tp_size": "4", "moe_tp_size": "4",
                             "system": "b300_sxm"}, models, rules)
    assert cfg.backend.scheduler.max_running_requests != 128
    assert not any(n.startswith("harness recipe") for n in notes)
    cfg, _ = row_config({**sglang, "precision": "fp4", "gemm_quant_mode": "nvfp4",
                         "moe_quant_mode": "nvfp4"}, models, rules)
    assert cfg.backend.scheduler.max_running_requests == 256
    assert cfg.backend.kv_cache.memory_fraction == 0.85
    # GLM-5 under each of its organisation's names; Qwen3.5 on B300 by checkpoint
    for name in ("zhipuai/GLM-5", "zai-org/GLM-5"):
        glm = {**sglang, "model_path": name, "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"}
        cfg, _ = row_config(glm, ModelResolver(configs, rules), rules)
        assert cfg.backend.scheduler.token_budget == 32768
        assert cfg.backend.kv_cache.memory_fraction == 0.85
    qwen = {**sglang, "model_path": "Qwen/Qwen3.5-397B-A17B", "system": "b300_sxm",
            "tp_size": "4", "moe_tp_size": "4", "gemm_quant_mode": "fp8",
            "moe_quant_mode": "fp8"}
    cfg, _ = row_config(qwen, ModelResolver(configs, rules), rules)
    assert (cfg.backend.scheduler.token_budget, cfg.backend.kv_cache.memory_fraction) == (
        16384, 0.8)
    cfg, _ = row_config({**qwen, "system": "b200_sxm"}, ModelResolver(configs, rules), rules)
    assert cfg.backend.kv_cache.memory_fraction != 0.8   # retuned over its history


def test_sglang_rows_keep_the_kv_cache_in_the_model_dtype_unless_the_launch_sets_it():
    # SGLang's --kv-cache-dtype defaults to auto (the model's dtype) and the harness's
    # SGLang launches on H100/H200 pass none (but Qwen3.5's), so an fp8-labelled SGLang
    # row there caches BF16 whatever the model; Qwen3.5's script passes fp8_e4m3 (its
    # recipe); on Blackwell the launches pass fp8 and the label rule stays; other engines
    # keep the label's fp8
    rules = load_rules()
    base = deepseek_r1_agg_row(system="h200_sxm", backend="sglang", backend_version="0.5.9",
                               batch_size="16")
    models = ModelResolver(None, rules)
    for same in ({}, {"isl": "1024", "osl": "1024"}, {"system": "h100_sxm"},
                 {"model_path": "deepseek-ai/DeepSeek-V3"}):
        cfg, notes = row_config({**base, **same}, models, rules)
        assert cfg.precision.kv_cache == "bf16", same
        assert any("KV cache in the model's dtype" in n and "--kv-cache-dtype" in n
                   for n in notes), same
    cfg, notes = row_config({**base, "model_path": "Qwen/Qwen3.5-397B-A17B",
                             "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8"}, models, rules)
    assert cfg.precision.kv_cache == "fp8"
    assert any("KV cache fp8 as the launch script sets it" in n and "qwen3.5_fp8_h200" in n
               for n in notes)
    for other in ({"backend": "trtllm", "backend_version": "1.1.0rc2.post2"},
                  {"backend": "vllm", "backend_version": "0.11.0"},
                  {"system": "b200_sxm"}, {"system": "gb200"}):
        cfg, notes = row_config({**base, **other}, models, rules)
        assert cfg.precision.kv_cache == "fp8", other
        assert not any("KV cache in the model's dtype" in n for n in notes), other
    # a bf16-labelled SGLang row has nothing to override: no note
    cfg, notes = row_config({**base, "precision": "bf16", "gemm_quant_mode": "",
                             "moe_quant_mode": ""}, models, rules)
    assert not any("KV cache in the model's dtype" in n for n in notes)


def test_package_rules_and_code_carry_no_validation_file_labels():
    # no campaign names, source file names, dates or provenance keys of a validation
    # file in the package's rules or code, and no model-name substring rule
    import re
    import perfcast
    root = Path(perfcast.__file__).parent
    banned = re.compile(r"source_file=|silicon_concurrency|aic-auto|"
                        r"db-dump|workflow_run_id|20[0-9]{2}-[01][0-9]-[0-3][0-9]\.csv|"
                        r"isl_multiple_for_models|max_in_flight: 100")
    hits = [f"{p.relative_to(root)}: {m.group(0)}" for p in root.rglob("*")
            if p.suffix in (".py", ".yaml") for m in [banned.search(p.read_text("utf-8"))] if m]
    assert hits == []


def test_littles_law_diagnostics_by_hand():
    # C=8, osl=101, TPOT 10 ms: decode 1000 ms; TTFT 250 ms -> e2e 1250 ms
    assert closed_loop_in_decode(8, 101, 250.0, 10.0) == pytest.approx(8 * 1000 / 1250)
    # mean gap between completions e2e / C = 156.25 ms; TTFT is 1.6 of them
    assert ttft_in_completion_gaps(8, 101, 250.0, 10.0) == pytest.approx(1.6)
    # the two views add up: in decode + waiting share = C
    waiting = 8 - closed_loop_in_decode(8, 101, 250.0, 10.0)
    assert waiting == pytest.approx(ttft_in_completion_gaps(8, 101, 250.0, 10.0))


def test_seed_reaches_the_simulated_clients():
    # sampled lengths (harness ratio 0.8) differ by seed, so the prediction moves a little
    from perfcast.serving.silicon import validate_rows as run
    row = dict(read_rows(FIXTURE)[0], mode="agg", isl="512", osl="64", batch_size="8",
               tp_size="1", pp_size="1", attention_dp_size="1", moe_tp_size="",
               moe_ep_size="1", silicon_data_source="silicon_concurrency=8")
    a, b = run([row]), run([row], seed=1)
    assert a[0].predicted and b[0].predicted
    assert a[0].pred_ttft_ms != b[0].pred_ttft_ms
    assert b[0].pred_ttft_ms == pytest.approx(a[0].pred_ttft_ms, rel=0.3)


def test_a_deployment_may_span_the_systems_scale_up_domain():
    # 16 GPUs: more than an HGX H100 board (8), inside a GB200 NVL72 rack (72)
    from perfcast.serving.silicon import RowError
    kw = dict(tp_size="16", moe_tp_size="16", attention_dp_size="1", batch_size="16")
    cfg, _ = _agg_row(system="gb200", **kw)
    assert cfg.pool.plan.tp == 16
    with pytest.raises(RowError, match="exceeds one 8-GPU node"):
        _agg_row(system="h100_sxm", **kw)


def test_validate_tasks_put_each_disagg_row_first_then_agg_rows_by_deployment():
    from perfcast.cli.validate import deployment_groups

    def row(mode, backend, version):
        return {"system": "h100_sxm", "backend": backend, "backend_version": version,
                "mode": mode}

    rows = [row("agg", "vllm", "0.12.0"), row("disagg", "sglang", "0.5.6"),
            row("agg", "trtllm", "1.0"), row("agg", "vllm", "0.12.0"),
            row("disagg", "sglang", "0.5.6"), row("agg", "vllm", "0.18.0")]
    assert deployment_groups(rows) == [[1], [4], [0, 3], [2], [5]]


def test_worker_processes_give_the_same_document_as_one_process():
    """`--workers`: one deployment per task in local processes; the rows, their order,
    their default ids (position in the file) and every number are those of one process."""
    from dataclasses import replace

    from perfcast.cli.validate import ValidateArgs, deployment_groups, run_validate

    rows = read_rows(FIXTURE) + [r for r in read_rows(FIXTURE.parent / "disagg_rows.csv")
                                 if r["system"] == "h100_sxm"]   # (the H200 ones are slow)
    del rows[1]["id"]   # its id becomes "row2"
    assert len(deployment_groups(rows)) >= 5
    a = ValidateArgs(file=str(FIXTURE))
    one, _ = run_validate(replace(a, workers=1), rows)
    seen = []
    two, results = run_validate(replace(a, workers=2), rows,
                                progress=lambda done, total: seen.append((done, total)))
    assert json.dumps(two, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert results[1].row_id == "row2"
    assert [r.row_id for r in results][2:] == [r["id"] for r in rows[2:]]
    assert seen[-1] == (len(rows), len(rows)) and seen == sorted(seen)
    assert any(r.predicted for r in results) and any(r.reason for r in results)


def test_a_fractional_agg_batch_size_gives_back_the_whole_concurrency():
    """batch_size = C / attention-DP: 100 clients on 8 ranks record 12.5."""
    rules = load_rules()
    models = ModelResolver(None, rules)
    row = deepseek_r1_agg_row(system="h200_sxm", backend="sglang", backend_version="0.5.6",
                              tp_size="1", attention_dp_size="8", moe_tp_size="1",
                              moe_ep_size="8", batch_size="12.5")
    cfg, _ = row_config(row, models, rules)
    assert cfg.concurrency == 100
    with pytest.raises(RowError, match="not a whole number of clients"):
        row_config({**row, "batch_size": "12.4"}, models, rules)


def test_sglang_rows_keep_the_launch_fraction_else_the_engine_derives_it():
    rules = load_rules()
    models = ModelResolver(None, rules)
    # InferenceX dsr1_fp8_h200.sh passes --mem-fraction-static 0.82
    cfg, _ = row_config(deepseek_r1_agg_row(system="h200_sxm", backend="sglang",
                                            backend_version="0.5.9", batch_size="64"),
                        models, rules)
    assert cfg.backend.kv_cache.memory_fraction == 0.82
    assert cfg.backend.kv_cache.reserved_memory is None
    # no launch fraction: SGLang's own, from the harness's chunk (16384)
    row = {"id": "x", "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm",
           "backend": "sglang", "backend_version": "0.5.9", "precision": "bf16",
           "mode": "agg", "isl": "1024", "osl": "128", "gemm_quant_mode": "bf16",
           "moe_quant_mode": "", "batch_size": "16", "pp_size": "1", "tp_size": "2",
           "attention_dp_size": "1", "moe_tp_size": "", "moe_ep_size": "",
           "silicon_ttft_ms": "1", "silicon_tpot_ms": "1", "silicon_data_source": ""}
    cfg, notes = row_config(row, models, rules)
    kv = cfg.backend.kv_cache
    assert cfg.backend.scheduler.token_budget == 16384 and kv.reserved_memory is not None
    assert kv.reserved_memory.fraction(
        memory_gib=80, chunk_tokens=16384, graph_max_batch=cfg.backend.cuda_graph.max_batch,
        stage_gpus=2, pp=1, dp=1) == round(1 - (512 + 24576 + 512 + 256) / 81920, 3)
    assert "memory fraction 0.684: no launch setting, so sglang's own rule (>=0.5.3) holds " \
           "back 25.2 of 80 GiB" in notes


def _harness_file(tmp_path, text: str) -> Path:
    path = tmp_path / "harness.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_harness_file_states_the_client_of_every_row(tmp_path):
    """`--harness`: fixed lengths and 4 requests per client instead of the rules' sampled
    lengths and 10 per client; with fixed lengths the clients' seed has nothing to draw."""
    from perfcast.serving.silicon import load_harness, rules_with_harness

    harness = load_harness(_harness_file(
        tmp_path, "source: the client's launch script\nrange_ratio: 1.0\n"
                  "prompts_per_concurrency: 4\n"))
    row = dict(read_rows(FIXTURE)[0], mode="agg", isl="512", osl="64", batch_size="8",
               tp_size="1", pp_size="1", attention_dp_size="1", moe_tp_size="",
               moe_ep_size="1", silicon_data_source="silicon_concurrency=8")
    rules = load_rules()
    models = ModelResolver(None, rules)
    default, _ = row_config(row, models, rules)
    fixed, _ = row_config(row, models, rules_with_harness(rules, harness))
    assert (default.range_ratio, default.num_requests) == (0.8, 80)
    assert (fixed.range_ratio, fixed.num_requests) == (1.0, 32)
    assert load_rules()["harness"]["range_ratio"] == 0.8   # the rules are not changed
    a, b = validate_rows([row], harness=harness), validate_rows([row], harness=harness, seed=1)
    assert a[0].predicted and a[0].pred_ttft_ms == b[0].pred_ttft_ms
    assert a[0].pred_tpot_ms == b[0].pred_tpot_ms
    assert any("prompts_per_concurrency 4, range_ratio 1.0 (the client's launch script)" in n
               for n in a[0].assumptions)
    sampled = validate_rows([row])[0]
    assert sampled.pred_ttft_ms != a[0].pred_ttft_ms


@pytest.mark.parametrize("text, match", [
    ("range_ratio: 1.0\n", "field 'source': missing"),
    ("source: s\nwarmup: 2\n", "field 'warmup': unknown setting"),
    ("source: s\nrange_ratio: 0\n", "field 'range_ratio': bad value 0"),
    ("source: s\nprompts_per_concurrency: 2.5\n", "field 'prompts_per_concurrency': bad value"),
    ("source: s\n", "states no client setting"),
    ("- range_ratio\n", "must be a mapping"),
])
def test_a_bad_harness_file_names_the_file_and_the_field(tmp_path, text, match):
    from perfcast.core.errors import ConfigError
    from perfcast.serving.silicon import load_harness

    path = _harness_file(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as err:
        load_harness(path)
    assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_harness(tmp_path / "missing.yaml")


def test_cli_json_names_the_harness_it_applied(tmp_path):
    path = _harness_file(tmp_path, "source: aiperf launch\nrange_ratio: 1.0\n")
    docs = []
    for extra in ([], ["--harness", str(path)]):
        out = tmp_path / f"v{len(docs)}.json"
        res = CliRunner().invoke(app, ["validate", "silicon", str(FIXTURE), "--format", "json",
                                       "--workers", "1", "-o", str(out), *extra])
        assert res.exit_code == 0, res.output
        docs.append(json.loads(out.read_text()))
    assert docs[0]["harness"] == "rules"
    assert docs[1]["harness"] == {"source": "aiperf launch", "range_ratio": 1.0}
    bad = _harness_file(tmp_path, "source: s\nrange_ratio: 2\n")
    res = CliRunner().invoke(app, ["validate", "silicon", str(FIXTURE), "--harness", str(bad)])
    assert res.exit_code != 0 and "range_ratio" in res.output
