"""The published training measurements: the file loads, every row cites its source, the
rows agree with themselves and with the catalog, and the FLOP conventions are right on
numbers a person can check by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast.core.errors import ConfigError
from perfcast.hardware import load_system
from perfcast.training.published import (
    FLOP_CONVENTIONS,
    ModelShape,
    convention_flops,
    implied_step_time_s,
    load_published,
    megatron_2021_recompute_flops,
    megatron_core_model_flops,
    palm_model_flops,
    parameter_count,
    predicted_tflops_per_gpu,
)

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "training_published.yaml"

GPT3_175B = ModelShape(family="gpt", layers=96, hidden=12288, heads=96, ffn_hidden=4 * 12288,
                       vocab=51200, seq_length=2048)


@pytest.fixture(scope="module")
def published():
    return load_published(DATA)


def test_file_loads_with_both_papers_and_a_held_out_list(published):
    val = published.group("validation")
    assert {r.id.split("-")[0] for r in val} == {"megatron2021", "llama3"}
    assert len([r for r in val if r.id.startswith("megatron2021")]) == 10   # Table 1: 1.7B..1T
    assert len([r for r in val if r.id.startswith("llama3")]) == 3          # Table 4
    assert published.group("held_out")
    assert set(published.conventions) >= {r.flop_convention for r in published.runs}


def test_every_row_cites_a_table_and_says_how_it_was_verified(published):
    for r in published.runs:
        assert (r.source.get("paper") or r.source.get("repository")) and r.source["table"], r.id
        assert r.row, r.id
        assert r.verified_from, r.id
        assert r.verified or r.unverified, r.id


def test_layouts_multiply_to_the_gpu_count_and_batches_divide(published):
    for r in published.runs:
        lay = r.layout
        assert lay.tp * lay.pp * lay.dp * lay.cp == r.gpus, r.id
        if lay.micro_batch is not None:
            assert lay.global_batch % (lay.micro_batch * lay.dp) == 0, r.id
        if lay.virtual_pipeline is not None:
            assert r.model.layers % (lay.pp * lay.virtual_pipeline) == 0, r.id


def test_aggregate_throughput_is_per_gpu_times_gpus(published):
    """Table 1's last column is its per-GPU column times the GPUs (3 significant figures)."""
    rows = [r for r in published.runs if "aggregate_pflops" in r.published]
    assert len(rows) >= 10
    for r in rows:
        agg = r.published["tflops_per_gpu"] * r.gpus / 1000
        assert agg == pytest.approx(r.published["aggregate_pflops"], rel=0.01), r.id


def test_utilisation_columns_match_the_catalog_peak(published):
    """percent-of-peak / MFU = TFLOP/s per GPU over the catalog's dense fp16/bf16 peak
    (A100 312, H100 989.4), to the rounding of the printed columns."""
    checked = 0
    for r in published.runs:
        share = r.published.get("mfu") or (r.published.get("percent_of_peak", 0) / 100)
        if not share or "tflops_per_gpu" not in r.published:
            continue
        peak = load_system(r.device).device.engine("matrix").peak_for(r.precision) / 1e12
        assert r.published["tflops_per_gpu"] / peak == pytest.approx(share, abs=0.011), r.id
        checked += 1
    assert checked >= 20


def test_table1_parameter_counts_match_the_shapes(published):
    """The paper's parameter column (billions, one decimal) from the shape:
    l (12 h^2 + 13 h) + V h + s h (tied embeddings, learned positions, biases, LayerNorms)."""
    rows = [r for r in published.runs if r.id.startswith("megatron2021")]
    for r in rows:
        assert parameter_count(r.model) / 1e9 == pytest.approx(r.model.params_b, abs=0.06), r.id
    one_t = next(r for r in rows if r.id == "megatron2021-1t").model
    h = 25600
    assert parameter_count(one_t) == 128 * (12 * h * h + 13 * h) + 51200 * h + 2048 * h


def test_megatron_2021_formula_for_gpt3_175b_by_hand():
    """96 B s l h^2 (1 + s/6h + V/16lh) with B=1536, s=2048, l=96, h=12288, V=51200:
    96*1536*2048*96*12288^2 = 4.3775e18; s/6h = 1/36; V/16lh = 51200/18874368."""
    base = 96 * 1536 * 2048 * 96 * 12288**2
    assert base == pytest.approx(4.37749e18, rel=1e-5)
    assert megatron_2021_recompute_flops(GPT3_175B, 1536) == pytest.approx(4.51097e18, rel=1e-5)


def test_recompute_convention_adds_exactly_one_forward_without_logits():
    """Narayanan's 96(...) minus Megatron's model FLOPs 72(1 + s/6h + V/12lh) of the same
    GPT is the recomputed forward: 24 B s l h^2 (1 + s/6h)."""
    b, m = 8, GPT3_175B
    s, l, h = m.seq_length, m.layers, m.hidden
    diff = megatron_2021_recompute_flops(m, b) - megatron_core_model_flops(m, b)
    assert diff == pytest.approx(24 * b * s * l * h * h * (1 + s / (6 * h)), rel=1e-12)


def test_palm_convention_is_six_n_plus_attention():
    m = GPT3_175B
    n = parameter_count(m)
    per_token = 6 * n + 12 * m.layers * m.heads * m.head_dim * m.seq_length
    assert palm_model_flops(m, 3) == pytest.approx(per_token * 3 * m.seq_length, rel=1e-12)


def test_prediction_converted_with_the_papers_convention(published):
    """A predicted step time equal to the one the published figure implies reproduces the
    published TFLOP/s; half the time doubles it. 1T row by hand: F / (3072 x 163e12)."""
    run = next(r for r in published.runs if r.id == "megatron2021-1t")
    m = run.model
    f = 96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    assert convention_flops(run) == pytest.approx(f, rel=1e-12)
    step = implied_step_time_s(run)
    assert step == pytest.approx(f / (3072 * 163e12), rel=1e-12)
    assert m.layers == 128 and run.layout.global_batch == 3072
    assert predicted_tflops_per_gpu(run, step) == pytest.approx(163, rel=1e-12)
    assert predicted_tflops_per_gpu(run, step / 2) == pytest.approx(326, rel=1e-12)
    for r in published.runs:
        assert predicted_tflops_per_gpu(r, implied_step_time_s(r)) == pytest.approx(
            r.published.get("tflops_per_gpu") or convention_flops(r) / (
                r.gpus * r.published["step_time_s"] * 1e12), rel=1e-9)


def test_every_convention_is_described():
    assert set(FLOP_CONVENTIONS) == {"megatron_2021_recompute", "megatron_core_model",
                                     "palm_model"}


ROW = """
conventions: {palm_model: x}
validation:
  - id: a
    source: {paper: P, table: T}
    row: r
    verified: true
    verified_from: [S]
    model: {family: llama, layers: 2, hidden: 64, heads: 4, ffn_hidden: 128, vocab: 100, seq_length: 16}
    gpus: 8
    device: h100_sxm
    precision: bf16
    layout: {tp: 2, pp: 2, dp: 2, cp: 1, global_batch: 8}
    published: {tflops_per_gpu: 100}
    flop_convention: palm_model
"""


@pytest.mark.parametrize("edit, field", [
    (("source: {paper: P, table: T}", "source: {table: T}"), "validation[a].source"),
    (("verified: true\n    verified_from: [S]", "verified: false"), "validation[a].unverified"),
    (("tp: 2, pp: 2", "tp: 2, pp: 4"), "validation[a].layout"),
    (("published: {tflops_per_gpu: 100}", "published: {mfu: 0.4}"), "validation[a].published"),
    (("flop_convention: palm_model", "flop_convention: guess"), "validation[a].flop_convention"),
    (("recompute", "x"), None),
])
def test_bad_rows_name_the_field(tmp_path, edit, field):
    path = tmp_path / "rows.yaml"
    path.write_text(ROW.replace(*edit), encoding="utf-8")
    if field is None:   # an edit that leaves the row valid loads
        assert load_published(path).runs[0].id == "a"
        return
    with pytest.raises(ConfigError) as err:
        load_published(path)
    assert f"field '{field}'" in str(err.value) and str(path) in str(err.value)


def test_runs_before_flashattention_materialise_the_softmax(published):
    """FlashAttention (arXiv:2205.14135) appeared in May 2022: the 2021 and 2022 Megatron rows
    ran unfused attention; Table 1's script used PyTorch DDP (overlapped gradient
    all-reduce) up to 18B and Megatron's local DDP (after the backward) from 39B."""
    for r in published.runs:
        if r.id.startswith(("megatron2021", "korthikanti2022")):
            assert r.layout.attention_kernel == "unfused", r.id
    overlap = {r.id: r.layout.overlap_grad_reduce for r in published.runs
               if r.id.startswith("megatron2021")}
    assert [k for k, v in overlap.items() if v] == [
        "megatron2021-1.7b", "megatron2021-3.6b", "megatron2021-7.5b", "megatron2021-18b"]


def test_assumptions_say_why_and_name_layout_fields(published):
    assumed = [r for r in published.runs if r.assumed]
    assert {r.id for r in assumed} == {r.id for r in published.runs
                                       if r.id.startswith(("llama3", "narayanan2021-table2"))}
    for r in assumed:
        assert r.assumed["why"]
        if r.id.startswith("llama3"):
            assert r.assumed["virtual_pipeline"] == 2
        # only fields the source leaves open are assumed
        for key in r.assumed:
            if key != "why":
                assert getattr(r.layout, key) is None, (r.id, key)
