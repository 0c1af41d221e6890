"""`collect grid` on a profiling database: the rows it writes are exactly the rows the
estimates of its target models look up, both ways.

The database starts with only the real CANN 8.5 `op_mapping.yaml` (tests/fixtures/
msmodeling, a verbatim copy); the grid writes the kernel CSVs in the per-kernel format
(empty durations), a constant duration is filled in, and the estimates at the grid's
layouts and steps run with the profiling model on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perfcast.collect.grid import generate_grid, grid_batches, grid_layouts
from perfcast.collect.tables import LATENCY_PRIORITY, load_database, read_table, write_tables
from perfcast.evidence.factory import analytic_providers, build_resolver
from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
from perfcast.evidence.profiling.metrics import MetricsCollector
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.evidence.profiling.shape_rules import fractal_nz_to_nd
from perfcast.evidence.resolver import CostResolver
from perfcast.hardware import load_system
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.workload import load_model_spec
from perfcast.workload.quant import precision_for_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msmodeling"
REAL_MAPPING = FIXTURES / "op_mapping.vllm0.18.0_torch2.9.0_cann8.5.yaml"
DEVICE = "atlas_800_a3_752t_128g_die"  # the mapping's device

# Calls the real mapping cannot answer whatever rows the database holds: the grid writes
# none for them and the estimate misses them, each for the reason named here.
MAPPING_MISSES = {
    # not in the CANN 8.5 mapping at all
    "tensor_cast.concat_and_cache_mla.default": "unmapped",
    "aten.amax.default": "unmapped",
    "aten.exp.default": "unmapped",
    # DeepSeek-V3.2's sparse attention (DSA): composites without a decomposer, and the
    # indexer's layer norm the mapping does not list
    "tensor_cast.dsa_indexer.default": "no_sub_kernels",
    "tensor_cast.mla_sparse_attention.default": "no_sub_kernels",
    "aten.layer_norm.default": "unmapped",
}

# (model, TP degrees, EP degrees): small grids of the layouts TensorCast runs them at
CASES = {
    "deepseek-ai/DeepSeek-V3": ((8, 16), (16,)),
    "deepseek-ai/DeepSeek-V3.2": ((16,), (16,)),
    "Qwen/Qwen3-32B": ((1, 4), ()),
    "Qwen/Qwen3-235B-A22B": ((4,), (4,)),
}
BATCHES, PREFILL, DECODE = (1, 4), (128,), (2048,)


class RecordingSource(ProfilingDataSource):
    """The data source the estimate reads, noting every row an answer used."""

    used: set[str]

    def lookup(self, op):
        result = super().lookup(op)
        for rid in getattr(result, "details", {}).get("record_ids", ()):
            self.used.add(rid)
        return result


def _fill_durations(db: Path, comm: Path, value: str = "1.0") -> int:
    tables = list(load_database(db).values()) + list(load_database(comm).values())
    for t in tables:
        col = next(c for c in LATENCY_PRIORITY if c in t.header)
        for row in t.rows:
            row[col] = value
    write_tables(tables)
    return sum(len(t.rows) for t in tables)


@pytest.fixture
def database(tmp_path):
    db = tmp_path / "perf" / "vllm_ascend" / "db"   # the mapping's comm dir: ../../hccl/v8.5
    db.mkdir(parents=True)
    shutil.copy(REAL_MAPPING, db / "op_mapping.yaml")
    return db


@pytest.mark.parametrize("model", sorted(CASES))
def test_grid_rows_are_the_rows_the_estimates_query(database, model):
    tp_sizes, ep_sizes = CASES[model]
    result = generate_grid(database, [model], rows=0, max_memory_gb=0, tp_sizes=tp_sizes,
                           ep_sizes=ep_sizes, batch_sizes=BATCHES, prefill_lengths=PREFILL,
                           decode_lengths=DECODE)
    assert result.calls > 0 and sum(result.appended.values()) > 0
    comm = (database / "../../hccl/v8.5").resolve()
    generated = _fill_durations(database, comm)
    assert generated == sum(result.appended.values())
    for t in load_database(database).values():     # real per-kernel CSV format
        assert t.header[:3] == ["Input Shapes", "Input Data Types", "Input Formats"]

    system = load_system(DEVICE)
    spec = load_model_spec(model)
    used: set[str] = set()
    collector = MetricsCollector()
    for plan in grid_layouts(spec, tp_sizes, ep_sizes):
        ds = RecordingSource(database, system, plan)
        ds.used = used
        resolver = CostResolver([EmpiricalPerformanceModel(system, ds,
                                                           fallback_model=build_resolver(system)),
                                 *analytic_providers(system)])
        for batch in grid_batches(BATCHES, PREFILL, DECODE):
            request = EstimateRequest(model=spec, device=system, plan=plan, batch=batch,
                                      precision=precision_for_model(spec), mla_call="tensorcast")
            collector.collect_from_costed(estimate_step(request, resolver).costed)

    # (b) every kernel query hits, but for the calls the mapping itself cannot answer
    costed = [r for r in collector.records if r.kernel_type not in ("zero_cost", "accepted_miss")]
    misses = {(r.func_name, r.reason.split(" (")[0]) for r in costed if not r.hit}
    assert {f for f, _ in misses} <= set(MAPPING_MISSES), misses
    assert all(MAPPING_MISSES[f] in reason for f, reason in misses), misses
    hits = sum(r.count for r in costed if r.hit)
    assert hits == sum(r.count for r in costed if r.func_name not in MAPPING_MISSES)
    assert not any(r.reason.startswith("partial") for r in costed)

    # (a) every generated row answered some query of these estimates
    every = {f"{t.kernel_type}.csv#{i}" for d in (database, comm)
             for t in load_database(d).values() for i in range(len(t.rows))}
    assert every - used == set()
    assert len(every) == generated


def test_grid_rows_carry_the_query_paths_keys(database):
    """MLA (TensorCast's call: absorb bmms token-first / heads-first + FIA on the latent
    cache), routed experts and collectives land in their kernels with the columns their
    query paths filter on."""
    generate_grid(database, ["deepseek-ai/DeepSeek-V3"], rows=0, max_memory_gb=0,
                  tp_sizes=(16,), ep_sizes=(16,), batch_sizes=(4,), prefill_lengths=(),
                  decode_lengths=(2048,))
    fia = read_table(database / "FusedInferAttentionScore.csv")
    # decode over the latent cache: Q (B, H/tp, kv_lora_rank), one KV head, no mask
    assert {(r["Input Shapes"], r["Runtime avg_seq_len"], r["Runtime sparse_mode"],
             r["Runtime num_key_value_heads"]) for r in fia.rows} == {("4,8,512", "2049", "0", "1")}
    bmm = read_table(database / "BatchMatMulV2.csv").rows        # q_nope @ W_UK_T heads-first
    assert [r["Input Shapes"] for r in bmm] == ["8,4,128;8,128,512"]
    tbmm = read_table(database / "TransposeBatchMatMul.csv").rows  # out @ W_UV token-first
    assert [r["Input Shapes"] for r in tbmm] == ["4,8,512;8,512,128"]
    # TensorCast's grouped matmuls take tensor lists (per expert that receives rows: its
    # rows, then its weight), flattened into the lookup's inputs as TensorCast does: 8 of
    # rank 0's 16 experts get 16 rows each (4 x 8 routed rows split from expert 0)
    gmm = {(r["Input Shapes"], r["Output Shapes"])
           for r in read_table(database / "GroupedMatmul.csv").rows}
    assert gmm == {(";".join(["16,7168"] * 8 + ["7168,4096"] * 8), "128,2048"),
                   (";".join(["16,2048"] * 8 + ["2048,7168"] * 8), "128,7168")}
    a2a = read_table((database / "../../hccl/v8.5/hcom_alltoallv_.csv").resolve()).rows
    assert a2a and {r["num_devices"] for r in a2a} == {"16"}


def test_grid_rows_are_new_once_and_stay_without_duration(database):
    kw = dict(rows=0, max_memory_gb=0, tp_sizes=(4,), ep_sizes=(), batch_sizes=(2,),
              prefill_lengths=(64,), decode_lengths=(512,))
    first = generate_grid(database, ["Qwen/Qwen3-32B"], **kw)
    assert first.appended and all(r["Average Duration(us)"] == "" for t in
                                  load_database(database).values() for r in t.rows)
    assert generate_grid(database, ["Qwen/Qwen3-32B"], **kw).appended == {}


def test_grid_needs_a_device_for_a_mapping_without_one(database):
    from perfcast.core.errors import ConfigError

    (database / "op_mapping.yaml").write_text(
        'operator_mappings:\n  "aten.mm.default":\n    kernel_type: MatMulV2\n')
    with pytest.raises(ConfigError, match="device"):
        generate_grid(database, ["Qwen/Qwen3-32B"], rows=0, tp_sizes=(1,), batch_sizes=(1,),
                      prefill_lengths=(16,), decode_lengths=())


def test_grid_command_on_a_profiling_database(database):
    from typer.testing import CliRunner

    from perfcast.cli.main import app

    res = CliRunner().invoke(app, [
        "collect", "grid", "--database-path", str(database), "--target-models",
        "Qwen/Qwen3-32B", "--rows", "0", "--max-memory-gb", "0", "--tp-sizes", "4",
        "--batch-sizes", "2", "8", "--prefill-lengths", "256", "--decode-lengths", "1024"])
    assert res.exit_code == 0, res.output
    assert "distinct calls looked up" in res.output
    # 4 steps (2 batches x prefill/decode) x qkv, o, gate_up, down, plus lm_head at m = 2
    # and 8 (a prefill step's logits are its last tokens: the decode step's shape)
    mm = read_table(database / "MatMulV2.csv").rows
    assert len(mm) == 4 * 4 + 2 and "FusedInferAttentionScore: +4 rows" in res.output


def test_fractal_nz_weights_are_tiled_only_where_the_lookup_reads_them(database):
    from perfcast.collect.query_rows import compute_row

    ds = ProfilingDataSource(database, load_system(DEVICE))
    x, w = ((8, 4096), "bf16"), ((4096, 6144), "bf16")
    row = compute_row(ds, ["MatMulV2"], [x, w], None, ["ND", "FRACTAL_NZ"])
    # (N/16, K/16, 16, 16): restored to (N, K), the transposed weight MatMulV2 records
    assert row.inputs == (((8, 4096), "bf16", "ND"), ((384, 256, 16, 16), "bf16", "FRACTAL_NZ"))
    # a grouped (E, K, N) weight: per-expert (N/16, K/16, 16, 16) tiles, restored to the
    # (E, N, K) stack TensorCast's batched_transpose rule reads
    gw = ((16, 4096, 1536), "bf16")
    row = compute_row(ds, ["GroupedMatmul"], [x, gw], None, ["ND", "FRACTAL_NZ"])
    assert row.inputs[1] == ((16, 96, 256, 16, 16), "bf16", "FRACTAL_NZ")
    assert fractal_nz_to_nd(row.inputs[1][0]) == (16, 1536, 4096)
    # a weight of no transposed reading (a norm's 1-D gamma) stays ND
    row = compute_row(ds, ["RmsNorm"], [x, ((4096,), "bf16")], None, ["ND", "FRACTAL_NZ"])
    assert row.inputs[1] == ((4096,), "bf16", "ND")
