"""Evidence the engine would run: per-family versions, kernel choice by dispatch rules,
per-table harness overheads and the plausibility screen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (CostEstimate, CostQuery, CostSubject, EstimateMethod,
                                         MatchKind, Miss)
from perfcast.evidence.harness_overhead import (CallOverhead, HarnessCorrection,
                                                fit_call_overheads, load_correction,
                                                save_correction)
from perfcast.evidence.plausibility import SLOW_FACTOR, screen_table
from perfcast.evidence.measured_view import MeasuredView
from perfcast.evidence.queries import query_for_task
from perfcast.hardware import load_system
from perfcast.evidence.engine_kernels import EngineKernelView
from perfcast.evidence.kernel_dispatch import dispatch_rules
from perfcast.serving.evidence import evidence_loader
from perfcast.evidence.factory import build_resolver
from perfcast.workload import Batch, ParallelPlan, load_model_spec
from perfcast.workload.build import build_task_graph
from perfcast.workload.tensors import TensorSpec

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"
H100 = load_system("h100_sxm")
BW = H100.device.memory.bw_bytes_per_s


def _gemm_rows(impls: dict[tuple[str, str], float], *, noise: float, seed: int = 0,
               planted: float = 0.0) -> pa.Table:
    """Rows with latency = c0 + bytes / (0.8 bw) (+ relative noise) per (dtype, kernel);
    `planted`: one extra bf16 row at that multiple of roofline + launch."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("operation", "dtype", "sel.int.m", "sel.int.n", "sel.int.k",
                            "sel.str.implementation", "latency_s")}

    def add(dtype, impl, m, n, k, lat):
        for key, v in zip(cols, ("gemm", dtype, m, n, k, impl, lat)):
            cols[key].append(v)

    for (dtype, impl), c0 in impls.items():
        width = 2.0 if dtype == "bf16" else 1.0
        for m in (1, 2, 4, 8, 16):
            for n in (256, 512, 1024, 2048):
                for k in (256, 512, 1024, 2048):
                    nbytes = (m * k + k * n) * width + m * n * 2.0
                    lat = (c0 + nbytes / (0.8 * BW)) * (1 + noise * rng.standard_normal())
                    add(dtype, impl, m, n, k, lat)
    if planted:
        m, n, k = 8, 2048, 2048
        roof = ((m * k + k * n) * 2.0 + m * n * 2.0) / BW
        add("bf16", "lin", m, n, k, planted * (roof + H100.device.launch_overhead_s))
    return pa.table(cols)


def test_a_known_per_call_overhead_is_recovered_within_its_uncertainty():
    truth = {("bf16", "lin"): 3.5e-6, ("fp8_block", "slow"): 60e-6}
    fit = fit_call_overheads(_gemm_rows(truth, noise=0.02), H100, source_revision="gemm/x/1")
    assert fit.floor_implementation == "bf16/lin"
    slow = fit.lookup("gemm", "fp8_block", "slow")
    assert slow.rows == 80 and slow.kernels_per_call == 2 and slow.intercept_std_s > 0
    assert abs(slow.intercept_s - 60e-6) < 3 * slow.intercept_std_s
    # the excess is what a graph replay does not run: 60 us - 2 kernels x the 3.5 us floor
    assert abs(slow.excess_s - (60e-6 - 2 * 3.5e-6)) < 3 * slow.excess_std_s
    assert fit.lookup("gemm", "bf16", "lin").excess_s == 0.0
    # with a cleanly timed kernel of the same kernel count in the table, that is the
    # reference: a 10 us two-kernel call leaves 50 us of the slow one to the harness
    truth[("fp8", "clean")] = 10e-6
    fit = fit_call_overheads(_gemm_rows(truth, noise=0.02, seed=1), H100)
    slow = fit.lookup("gemm", "fp8_block", "slow")
    assert abs(slow.excess_s - 50e-6) < 3 * slow.excess_std_s
    assert fit.lookup("gemm", "fp8", "clean").excess_s == 0.0
    # a small excess without a peer is within what the kernels can take: not removed
    small = fit_call_overheads(_gemm_rows({("bf16", "lin"): 3.5e-6, ("fp8", "q"): 9e-6},
                                          noise=0.0), H100)
    assert small.lookup("gemm", "fp8", "q").excess_s == 0.0


def test_correction_is_a_derived_record_stored_beside_the_snapshot(tmp_path):
    fit = fit_call_overheads(_gemm_rows({("bf16", "lin"): 3.5e-6}, noise=0.0), H100,
                             source_revision="sha256:" + "ab" * 32)
    path = save_correction(tmp_path, "sha256:" + "ab" * 32, fit)
    assert path == tmp_path / "derived" / ("ab" * 32) / "harness_overhead.v1.json"
    assert load_correction(tmp_path, "sha256:" + "ab" * 32) == fit
    assert save_correction(tmp_path, "sha256:" + "ab" * 32, fit) == path  # never rewritten
    assert load_correction(tmp_path, "sha256:" + "cd" * 32) is None


class _ByKernel:
    """A measured provider whose answer depends on the kernel the context asks for."""

    name, revision = "database", "r1"

    def __init__(self, latencies: dict[str, float]) -> None:
        self.latencies = latencies
        self.asked: list[tuple[str, str]] = []

    def supports(self, query):
        return True

    def estimate(self, query):
        impl = query.context.implementation_for(query.operation, query.dtype)
        self.asked.append((impl, query.context.runtime_revision))
        if impl not in self.latencies:
            return Miss(f"no rows of {impl}")
        return CostEstimate(latency_s=self.latencies[impl], method=EstimateMethod.MEASURED,
                            match_kind=MatchKind.EXACT, provider=self.name,
                            provider_revision=self.revision)


def _gemm_query(m: int, n: int = 4096, k: int = 4096, weight: str = "fp8_block",
                operation: str = "gemm") -> CostQuery:
    return CostQuery(subject=CostSubject.OPERATOR, operation=operation, hardware="h100_sxm",
                     dtype="fp8", dims=FrozenDict({"m": m, "n": n, "k": k}), flops=2.0 * m * n * k,
                     bytes_read=float(m * k + k * n), bytes_written=2.0 * m * n,
                     inputs=(TensorSpec((m, k), "bf16"), TensorSpec((k, n), weight)))


FLASH, DEEP, CUTLASS = ("FlashInferFp8BlockScaledMMKernel", "DeepGemmFp8BlockScaledMMKernel",
                        "CutlassFp8BlockScaledMMKernel")


def _view(inner, held, version="0.24.0", correction=None, graph_max_tokens=0):
    measured = MeasuredView(inner, harness=correction, graph_max_tokens=graph_max_tokens)
    return EngineKernelView(measured, system=H100, engine_version=version,
                            held={"gemm@fp8_block": held}, dispatch=dispatch_rules("vllm"))


def test_view_asks_for_the_kernel_the_engine_dispatches():
    inner = _ByKernel({FLASH: 10e-6, DEEP: 20e-6, CUTLASS: 30e-6})
    view = _view(inner, (DEEP, FLASH, CUTLASS))
    small, large = view.estimate(_gemm_query(8)), view.estimate(_gemm_query(64))
    assert (small.latency_s, large.latency_s) == (10e-6, 20e-6)
    assert any("flashinfer_swapab_small_m" in a for a in small.assumptions)
    assert any("vllm.fp8_block.deepgemm_dynamic_large_m" in a for a in large.assumptions)
    # an unaligned shape: CUTLASS
    assert view.estimate(_gemm_query(8, n=32)).latency_s == 30e-6


def test_a_missing_kernel_takes_the_nearest_admissible_one_and_says_so():
    inner = _ByKernel({DEEP: 20e-6, CUTLASS: 30e-6})
    est = _view(inner, (CUTLASS, DEEP)).estimate(_gemm_query(8))
    assert est.latency_s == 20e-6      # next in the engine's order, not the most rows
    assert any("which the tables lack" in a and DEEP in a for a in est.assumptions)
    # a table that names no kernel answers with its rows, and says so
    label = _view(_ByKernel({"vllm_default": 9e-6}), ("vllm_default",)).estimate(
        _gemm_query(8))
    assert label.latency_s == 9e-6
    assert any("names no kernel ('vllm_default')" in a for a in label.assumptions)
    # several kernels, none of them the engine's candidates: a miss, for the analytic model
    miss = _view(_ByKernel({"A": 1e-6, "B": 1e-6}), ("A", "B")).estimate(_gemm_query(8))
    assert isinstance(miss, Miss) and FLASH in miss.reason


def test_without_a_rule_the_most_rows_kernel_answers_and_says_why():
    from dataclasses import replace

    from perfcast.evidence.contracts import CostQueryContext

    ctx = CostQueryContext(runtime="vllm", runtime_revision="0.24.0",
                           implementations=FrozenDict({"gemm@fp8_block": DEEP}))
    inner = _ByKernel({DEEP: 20e-6, FLASH: 10e-6})
    est = _view(inner, (DEEP, FLASH), version="0.16.1").estimate(
        replace(_gemm_query(8), context=ctx))
    assert est.latency_s == 20e-6
    assert any("no vllm dispatch rules for version 0.16.1" in a and "most measured rows" in a
               for a in est.assumptions)


def _correction(excess: float) -> HarnessCorrection:
    entry = CallOverhead("gemm", "fp8_block", DEEP, excess + 7e-6, 1e-7, 50, 2, excess, 1e-7)
    return HarnessCorrection("gemm/vllm/0.24.0", 3.5e-6, "bf16/lin", (entry,))


def test_fitted_overhead_comes_off_graph_replayed_gemms_only():
    inner = _ByKernel({DEEP: 100e-6})
    view = _view(inner, (DEEP,), correction=_correction(50e-6), graph_max_tokens=512)
    est = view.estimate(_gemm_query(64))
    assert est.latency_s == pytest.approx(50e-6)
    assert est.components["harness_fixed_cost_s"] == pytest.approx(-50e-6)
    assert any("per-call overhead not run under the engine's CUDA graphs" in a
               for a in est.assumptions)
    # beyond the largest captured graph, or an engine without graphs: untouched
    assert view.estimate(_gemm_query(1024)).latency_s == pytest.approx(100e-6)
    eager = _view(inner, (DEEP,), correction=_correction(50e-6), graph_max_tokens=0)
    assert eager.estimate(_gemm_query(64)).latency_s == pytest.approx(100e-6)
    # never below the kernels' floor (2 x 3.5 us)
    tiny = _view(_ByKernel({DEEP: 20e-6}), (DEEP,), correction=_correction(50e-6),
                 graph_max_tokens=512)
    assert tiny.estimate(_gemm_query(64, n=256, k=256)).latency_s == pytest.approx(7e-6)


def test_the_screen_flags_a_planted_50x_row():
    table = _gemm_rows({("bf16", "lin"): 3.5e-6}, noise=0.0, planted=50.0)
    (res,) = screen_table(table, H100)
    assert res.rows == 81 and res.screened == 81
    assert res.too_slow == 1 and res.below_bound == 0
    assert res.worst_slow_ratio == pytest.approx(50.0)
    clean = screen_table(_gemm_rows({("bf16", "lin"): 3.5e-6}, noise=0.0), H100)[0]
    assert clean.too_slow == 0 and clean.worst_slow_ratio < SLOW_FACTOR


def test_the_estimate_flags_an_implausible_answer():
    view = _view(_ByKernel({DEEP: 5e-3}), (DEEP,))
    est = view.estimate(_gemm_query(64))
    assert any(a.startswith("implausibly slow evidence") for a in est.assumptions)
    fine = _view(_ByKernel({DEEP: 20e-6}), (DEEP,)).estimate(_gemm_query(64))
    assert not any("implausibly" in a for a in fine.assumptions)


def _first_task_estimate(ev, model: str, decode: int, pick):
    """The serving resolver's answer for the first task `pick` selects in a decode step."""
    graph = build_task_graph(load_model_spec(model), ParallelPlan(), Batch.decode(decode, 1000))
    task = next(t for t in graph.tasks if pick(t))
    return build_resolver(H100, ev.providers, launch_in_kernel_times=False).resolve(
        query_for_task(task, H100.name, ev.context)).estimate


def test_each_family_takes_its_nearest_collected_version():
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.24.0")
    assert ev.family_versions["gemm"] == "0.24.0"
    assert ev.family_versions["attention"] == "0.19.0"   # no 0.24.0 attention tables
    assert "attention" in ev.note and "at 0.19.0" in ev.note
    est = _first_task_estimate(ev, "meta-llama/Llama-3.1-8B", 8,
                               lambda t: t.group == "attn.core")
    assert est.provider in ("database", "interpolation")
    assert est.source_revision == "attention/vllm/0.19.0"


def test_a_dtype_the_familys_version_lacks_comes_from_the_nearest_version_with_it():
    # the fixture's vLLM 0.19.0 MoE table has no MXFP4 rows; 0.24.0 has gpt-oss experts
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.19.0")
    assert ev.family_versions["moe"] == "0.19.0"
    assert ev.family_versions["moe@mxfp4"] == "0.24.0"
    assert "moe mxfp4 at 0.24.0" in ev.note
    est = _first_task_estimate(ev, "openai/gpt-oss-120b", 1, lambda t: t.operation == "moe")
    assert est.provider in ("database", "interpolation")
    assert est.source_revision == "moe/vllm/0.24.0"


def test_version_policies_set_and_family(tmp_path):
    import shutil

    import pytest as _pytest

    from perfcast.core.errors import ConfigError

    # GEMM tables only at 0.24.0, MoE tables at 0.19.0 and 0.24.0; a 0.19.0 deployment
    for family, version in (("gemm", "0.24.0"), ("moe", "0.19.0"), ("moe", "0.24.0")):
        shutil.copytree(ROOT / "h100_sxm" / family / "vllm" / version,
                        tmp_path / "h100_sxm" / family / "vllm" / version)
    as_set = evidence_loader(tmp_path)("h100_sxm", "vllm", "0.19.0")
    assert as_set.family_versions["gemm"] == as_set.family_versions["moe"] == "0.24.0"
    # the fixture's 0.24.0 MoE slice has no fp8 or int4 rows: those come from 0.19.0
    assert as_set.family_versions["moe@int4"] == "0.19.0"
    assert as_set.note.startswith("evidence collected with vllm 0.24.0 (moe fp8, ")
    per_family = evidence_loader(tmp_path, versions="family")("h100_sxm", "vllm", "0.19.0")
    assert per_family.family_versions["gemm"] == "0.24.0"
    assert per_family.family_versions["moe"] == "0.19.0"
    assert "moe at 0.19.0" in per_family.note
    with _pytest.raises(ConfigError, match="unknown evidence version policy"):
        evidence_loader(tmp_path, versions="newest")


def test_a_deployment_without_tables_says_the_analytic_models_price_it(tmp_path):
    import shutil

    nothing = evidence_loader(ROOT)("b200_sxm", "vllm", "0.19.0")
    assert nothing.providers == ()
    assert nothing.note.startswith("no measured vllm kernel tables for b200_sxm under the "
                                   "evidence root (none at all)")
    assert "roofline" in nothing.note
    # MoE tables without GEMM ones are not a deployment's evidence either
    shutil.copytree(ROOT / "h100_sxm" / "moe" / "vllm" / "0.24.0",
                    tmp_path / "h100_sxm" / "moe" / "vllm" / "0.24.0")
    partial = evidence_loader(tmp_path)("h100_sxm", "vllm", "0.24.0")
    assert partial.providers == ()
    assert "(tables of moe but no gemm, which every deployment needs)" in partial.note


def test_serve_refuses_an_unknown_version_policy():
    from typer.testing import CliRunner

    from perfcast.cli.main import app

    out = CliRunner().invoke(app, ["serve", "meta-llama/Llama-3.1-8B", "--device", "h100_sxm",
                                   "--evidence-root", str(ROOT), "--backend", "vllm",
                                   "--evidence-versions", "newest", "--concurrency", "1",
                                   "--isl", "64", "--osl", "4"])
    assert out.exit_code == 2 and "--evidence-versions" in out.output
    assert "Traceback" not in out.output


def test_a_row_on_a_device_without_records_names_the_curves_applied_to_it():
    import csv

    from perfcast.calibrate.store import default_revision
    from perfcast.cli.validate import ValidateArgs, run_validate
    from perfcast.evidence.calibrated import calibrated_providers
    from perfcast.serving.silicon import curves_note

    (h100,) = calibrated_providers(load_system("h100_sxm"), default_revision())
    assert curves_note(h100) == ""                       # fitted on it: nothing to say
    (b200,) = calibrated_providers(load_system("b200_sxm"), default_revision())
    assert "applied to b200_sxm without any record of it" in curves_note(b200)
    path = Path(__file__).resolve().parents[1] / "fixtures" / "silicon" / "h100_sxm_slice.csv"
    with open(path, newline="", encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))
    row = {**row, "system": "b200_sxm"}
    doc, (res,) = run_validate(ValidateArgs(file=str(path)), [row])
    assert res.predicted
    assert curves_note(b200) in res.assumptions
