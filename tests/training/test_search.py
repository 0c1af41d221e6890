"""Training layout search: enumeration by hand-countable rules, the Pareto front, the
CLI; estimates through the same `estimate_training` as `perfcast train`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from perfcast.cli.train_search import parse_sizes
from perfcast.core.errors import ConfigError
from perfcast.training.search import (
    TrainCandidate,
    TrainSearchSpace,
    layout_choices,
    pareto_front,
    ranked,
    search,
)
from perfcast.workload import model_spec_from_config

TINY = model_spec_from_config({
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512,
    "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16"}, name="tiny-llama")


def _space(**kw) -> TrainSearchSpace:
    base = dict(model=TINY, device="h100_sxm", num_devices=(8,), global_batch_size=16,
                seq_length=1024, tp_sizes=(1, 2, 4, 8), pp_sizes=(1, 2, 4),
                virtual_pipeline_sizes=(1,), micro_batch_sizes=(1, 2),
                sequence_parallel=(False,), recompute=("none",), zero_stages=(0,))
    base.update(kw)
    return TrainSearchSpace(**base)


def test_parse_sizes_lists_and_ranges():
    assert parse_sizes("64", "--num-devices") == (64,)
    assert parse_sizes("32,8,16,8", "--num-devices") == (8, 16, 32)
    assert parse_sizes("8-64", "--num-devices") == (8, 16, 32, 64)
    assert parse_sizes("8-32:8", "--num-devices") == (8, 16, 24, 32)
    for bad in ("", "0", "8-4", "x", "8-16:0"):
        with pytest.raises(ConfigError, match="--num-devices"):
            parse_sizes(bad, "--num-devices")


def test_enumeration_counts_by_hand():
    """8 GPUs, TP in 1,2,4,8 x PP in 1,2,4 with TP x PP dividing 8: (1,1) (1,2) (1,4) (2,1)
    (2,2) (2,4) (4,1) (4,2) (8,1) = 9 splits (PP 4 with TP 4 would need 16); 4 layers
    divide every PP; micro-batch x DP divides the global batch 16 for micro-batch 1 and 2
    at every DP (8, 4, 2, 1): 9 x 2 = 18 layouts."""
    e = layout_choices(_space(), TINY)
    assert len(e.choices) == 18
    assert {(c.tp, c.pp, c.dp) for c in e.choices} == {
        (1, 1, 8), (1, 2, 4), (1, 4, 2), (2, 1, 4), (2, 2, 2), (2, 4, 1), (4, 1, 2),
        (4, 2, 1), (8, 1, 1)}
    assert all(c.tp * c.pp * c.dp * c.cp == 8 for c in e.choices)


def test_enumeration_skips_what_cannot_differ_and_counts_what_does_not_divide():
    # SP only with TP > 1, ZeRO only with DP > 1, V > 1 only with PP > 1
    e = layout_choices(_space(sequence_parallel=(False, True), zero_stages=(0, 1),
                              virtual_pipeline_sizes=(1, 2), micro_batch_sizes=(1,)), TINY)
    assert not any(c.sequence_parallel and c.tp == 1 for c in e.choices)
    assert not any(c.zero_stage and c.dp == 1 for c in e.choices)
    assert not any(c.virtual_pipeline > 1 and c.pp == 1 for c in e.choices)
    # 4 layers: PP 4 x V 2 = 8 chunks does not divide; the interleaved schedule needs the
    # microbatches (16 / DP) to be a multiple of PP
    assert not any(c.pp * c.virtual_pipeline > 4 for c in e.choices)
    assert e.skipped > 0 and "not divisible" in e.first_skip_reason
    # heads 8: TP 16 never divides
    assert not layout_choices(_space(num_devices=(16,), tp_sizes=(16,), pp_sizes=(1,)),
                              TINY).choices


def _cand(n: int, step: float, fits: bool = True) -> TrainCandidate:
    c = TrainCandidate(f"n{n} s{step}", n, {}, 1, step_time_s=step, fits=fits)
    c.failure = "" if fits else "does_not_fit"
    return c


def test_pareto_front_of_step_time_against_devices():
    cands = [_cand(8, 10.0), _cand(8, 12.0), _cand(16, 6.0), _cand(16, 5.5),
             _cand(32, 7.0), _cand(64, 2.0), _cand(64, 1.0, fits=False)]
    front = pareto_front(cands)
    assert [(c.num_devices, c.step_time_s) for c in front] == [(8, 10.0), (16, 5.5), (64, 2.0)]
    assert [c.step_time_s for c in ranked(cands)] == [2.0, 5.5, 6.0, 7.0, 10.0, 12.0]


LLAMA8B_SPACE = dict(model="meta-llama/Llama-3.1-8B", device="h100_sxm", num_devices=(1, 8),
                     global_batch_size=8, seq_length=1024, tp_sizes=(1, 8), pp_sizes=(1,),
                     virtual_pipeline_sizes=(1,), micro_batch_sizes=(1,),
                     sequence_parallel=(False,), recompute=("full",), zero_stages=(0, 1))


def test_search_keeps_what_fits_and_ranks_by_the_estimators_step_time():
    """Llama-3.1-8B (8.0e9 parameters x 16 bytes of weights, gradients and Adam state =
    128 GB > 80 GiB): alone on one H100 or replicated 8 ways without ZeRO it cannot fit;
    ZeRO-1 over 8 (2 + 2 + 12/8 bytes per parameter = 44 GB) or TP 8 (16 GB) fits."""
    from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

    result = search(TrainSearchSpace(**LLAMA8B_SPACE), executor="inline")
    by_label = {(c.num_devices, c.label): c for c in result.candidates}
    assert set(by_label) == {(1, "tp1 pp1 dp1 mb1 rc-full"), (8, "tp1 pp1 dp8 mb1 rc-full"),
                             (8, "tp1 pp1 dp8 mb1 rc-full z1"), (8, "tp8 pp1 dp1 mb1 rc-full")}
    for key in ((1, "tp1 pp1 dp1 mb1 rc-full"), (8, "tp1 pp1 dp8 mb1 rc-full")):
        # the static bound: 8.03e9 x 16 bytes = 120 GiB > 80 GiB, not costed
        c = by_label[key]
        assert c.failure == "does_not_fit" and c.step_time_s is None
        assert c.memory_bytes["static_lower_bound"] / 2**30 == pytest.approx(119.7, abs=0.5)
        assert "at least" in c.error
    fit = ranked(result.candidates)
    assert {c.label for c in fit} == {"tp1 pp1 dp8 mb1 rc-full z1", "tp8 pp1 dp1 mb1 rc-full"}
    assert fit[0].step_time_s <= fit[1].step_time_s
    assert all(c.memory_bytes["total"] <= c.memory_bytes["capacity"] for c in fit)
    # one cost path: the search's numbers are estimate_training's
    c = fit[0]
    direct = estimate_training(TrainingRequest(
        model="meta-llama/Llama-3.1-8B", device="h100_sxm",
        layout=TrainingLayout(**c.layout), global_batch_size=8, micro_batch_size=1,
        seq_length=1024))
    assert c.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
    assert c.memory_bytes == pytest.approx(direct.memory_bytes, rel=1e-12)
    # the bound is below what the estimator finds for the same layout
    alone = estimate_training(TrainingRequest(
        model="meta-llama/Llama-3.1-8B", device="h100_sxm", layout=TrainingLayout(
            recompute="full"), global_batch_size=8, micro_batch_size=1, seq_length=1024))
    assert not alone.fits
    assert by_label[(1, "tp1 pp1 dp1 mb1 rc-full")].memory_bytes["static_lower_bound"] <= \
        alone.memory_bytes["weights"] + alone.memory_bytes["gradients"] + \
        alone.memory_bytes["optimizer"]
    # one budget with fitting layouts: the front is its fastest
    assert [x.label for x in result.candidates if x.pareto] == [fit[0].label]


def test_local_processes_give_the_inline_answers():
    space = _space(num_devices=(4, 8), tp_sizes=(1, 2), pp_sizes=(1, 2), micro_batch_sizes=(1,))
    inline = search(space, executor="inline")
    local = search(space, executor="local", workers=2, chunk=3)
    assert [(c.label, c.num_devices, c.step_time_s) for c in inline.candidates] == \
        [(c.label, c.num_devices, c.step_time_s) for c in local.candidates]
    assert [c.label for c in inline.candidates if c.pareto] == \
        [c.label for c in local.candidates if c.pareto]


def test_progress_reports_every_layout():
    seen, total = [], []
    result = search(_space(), executor="inline", chunk=5, on_start=total.append,
                    on_progress=seen.append)
    assert total == [len(result.candidates)] == [18]
    assert seen == [5, 10, 15, 18]


def test_a_budget_nothing_divides_names_the_flag():
    with pytest.raises(ConfigError, match="--num-devices"):
        search(_space(num_devices=(3,), tp_sizes=(2,), pp_sizes=(2,)), executor="inline")


def test_cli_json_lists_every_layout_and_the_front(tmp_path):
    from perfcast.cli.main import app

    (tmp_path / "config.json").write_text(json.dumps(dict(TINY.raw)), encoding="utf-8")
    out = CliRunner().invoke(app, [
        "train-search", str(tmp_path), "--num-devices", "4-8", "--global-batch-size", "16",
        "--seq-length", "1024", "--tp-sizes", "1,2", "--pp-sizes", "1,2",
        "--virtual-pipeline-sizes", "1", "--micro-batch-sizes", "1",
        "--sequence-parallel", "off", "--recompute", "none", "--zero-stages", "0",
        "--executor", "inline", "--calibration", "none", "--format", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    # 4 GPUs: (1,1) (1,2) (2,1) (2,2); 8 GPUs: the same four splits
    assert doc["evaluated"] == len(doc["candidates"]) == 8
    assert doc["inputs"]["num_devices"] == [4, 8] and doc["calibration"] == "none"
    front = doc["pareto"]
    assert front and all(c["pareto"] for c in front)
    assert [c["num_devices"] for c in front] == sorted(c["num_devices"] for c in front)
    steps = [c["step_time_s"] for c in front]
    assert steps == sorted(steps, reverse=True)   # more devices on the front: faster
    assert set(doc["best_per_budget"]) <= {"4", "8"}
    # --calibration none: every answer is the analytic providers'
    assert set(doc["provenance"]) <= {"roofline", "collective_model"} and doc["provenance"]
    for c in doc["candidates"]:
        assert set(c["breakdown_s"]) >= {"forward", "backward", "pp_bubble"}
        assert c["device_seconds"] == pytest.approx(c["step_time_s"] * c["num_devices"])


def test_cli_bad_sizes_name_the_flag(tmp_path):
    from perfcast.cli.main import app

    out = CliRunner().invoke(app, ["train-search", "meta-llama/Llama-3.1-8B",
                                   "--recompute", "some", "--calibration", "none"])
    assert out.exit_code == 2
    assert "--recompute" in out.output


def test_moe_layouts_carve_ep_out_of_dp_times_tp():
    """Mixtral-style tiny model, 8 GPUs, TP 1, PP 1 or 2: EP must be TP x a divisor of DP
    (DP 8: EP 1, 2, 4, 8; DP 4: EP 1, 2, 4; EP 8 at DP 4 is refused and counted)."""
    from .tiny_models import MIXTRAL

    space = TrainSearchSpace(model=MIXTRAL, num_devices=(8,), global_batch_size=16,
                             seq_length=512, tp_sizes=(1,), pp_sizes=(1, 2),
                             ep_sizes=(1, 2, 4, 8), virtual_pipeline_sizes=(1,),
                             micro_batch_sizes=(1,), sequence_parallel=(False,),
                             recompute=("none",), zero_stages=(0,))
    e = layout_choices(space, MIXTRAL)
    assert sorted((c.pp, c.dp, c.ep) for c in e.choices) == [
        (1, 8, 1), (1, 8, 2), (1, 8, 4), (1, 8, 8), (2, 4, 1), (2, 4, 2), (2, 4, 4)]
    assert e.skipped == 1 and "--ep-size" in e.first_skip_reason
    result = search(space, executor="inline")
    assert all(c.ranked for c in result.candidates)
    # the dense enumeration of the same space has no EP > 1 at all
    assert {c.ep for c in layout_choices(space, TINY).choices} == {1}
