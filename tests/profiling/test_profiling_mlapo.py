"""TensorCast's `mlapo` against kernel rows derived from TensorCast's own call.

The database is the real CANN 8.5 mapping, the real FIA/TBMM fixture CSVs (the MLA call's
sub-kernels, tests/fixtures/msmodeling/fia_fixture) and the mlapo sub-kernel rows that
`mlapo_rows` derives from the `tensor_cast.mlapo.default` call of a real TensorCast run
(tests/fixtures/tensorcast/deepseek_v3_decode_tp8.json: DeepSeek-V3, TP8, 4 requests of
1 token over 2,048) by TensorCast's decomposition rule. Their latencies are illustrative
round numbers (MLAPO_US), not measurements: the tests check which kernels are queried
and hit, and that the composite is their sum."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from profiling_helpers import FIA_DB, REAL_MAPPING, measured_per_layer, op, v3_decode_step

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.decomposers import decompose_mlapo
from perfcast.evidence.profiling.metrics import MetricsCollector
from perfcast.evidence.profiling.op_mapping import load_op_mapping, parse_operator_mapping
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.workload import ParallelPlan

CASE = Path(__file__).resolve().parents[1] / "fixtures/tensorcast/deepseek_v3_decode_tp8.json"
COLUMNS = ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
           "Output Data Types", "Output Formats", "Average Duration(us)"]
DTYPES = {"float16": "DT_BF16", "bfloat16": "DT_BF16"}  # TensorCast's DTYPE_MAP
# illustrative round latencies (us) of the four sub-kernels, in TensorCast's order
MLAPO_US = [["MatMulV2", 20.0], ["RmsNorm", 5.0], ["MatMulV2", 10.0],
            ["KvRmsNormRopeCache", 8.0]]
MLA_US = 15.0 + 28.0 + 12.0   # the real fixture's TBMM + FIA + TBMM rows
POOL = 1135  # cache pool of the rows (the FIA fixture's profiled server: 1,135 blocks)


def cell(shapes) -> str:
    return ";".join(",".join(map(str, s)) for s in shapes)


def mlapo_rows(call: dict, block_size: int) -> list[tuple[str, dict]]:
    """The kernel rows TensorCast's `_decompose_mlapo_common` (BF16 `_decompose_mlapo`,
    tensor_cast/performance_model/profiling_database/profiling_data_source.py, msModeling
    84fec853) queries for one `mlapo` call, from the call's inputs (args 0 hidden, 3
    q_a_proj, 4 q_a norm, 5 q_b_proj, 6 kv_a_proj, 7 kv norm; tensor_cast/ops/mla.py):

    1. MatMulV2 [(T, h), (q_lora + kv_proj, h)] (fused_qkv_a_proj = q_a_proj + kv_a_proj);
    2. RmsNorm [(T, q_lora), q_a norm shape];
    3. MatMulV2 [(T, q_lora), q_b_proj shape];
    4. KvRmsNormRopeCache under `kv_cache_query.mode: pool_dim0_agnostic`: the row
       `_query_cache_postprocess` accepts, inputs (T,1,1,kv_proj), (kv_lora,), cos and sin
       (T,1,1,rope), slots (T,), then the k_rope and ckv cache pools (P, block, 1, rope),
       (P, block, 1, kv_lora) with any P; dtypes hidden x4, INT64, hidden x2; all ND.
    Output columns are left empty: the compute path matches inputs only."""
    hidden, dt = call["inputs"][0]
    q_a, q_a_norm, q_b, kv_a, kv_norm = (call["inputs"][i][0] for i in (3, 4, 5, 6, 7))
    t, h = hidden
    q_lora, kv_proj, kv_lora = q_a[0], kv_a[0], kv_norm[0]
    rope = kv_proj - kv_lora
    d = DTYPES[dt]

    def row(shapes, dtypes, us):
        return {"Input Shapes": cell(shapes), "Input Data Types": ";".join(dtypes),
                "Input Formats": ";".join("ND" for _ in shapes), "Output Shapes": "",
                "Output Data Types": "", "Output Formats": "", "Average Duration(us)": us}
    rot = (t, 1, 1, rope)
    return [
        ("MatMulV2", row([(t, h), (q_lora + kv_proj, h)], [d, d], MLAPO_US[0][1])),
        ("RmsNorm", row([(t, q_lora), tuple(q_a_norm)], [d, d], MLAPO_US[1][1])),
        ("MatMulV2", row([(t, q_lora), tuple(q_b)], [d, d], MLAPO_US[2][1])),
        ("KvRmsNormRopeCache", row(
            [(t, 1, 1, kv_proj), (kv_lora,), rot, rot, (t,), (POOL, block_size, 1, rope),
             (POOL, block_size, 1, kv_lora)], [d, d, d, d, "INT64", d, d], MLAPO_US[3][1])),
    ]


def tensorcast_call(name: str) -> dict:
    doc = json.loads(CASE.read_text())
    return next(c for c in doc["calls"] if c["op"].removeprefix("torch.ops.") == name)


def write_database(root: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copy(REAL_MAPPING, root / "op_mapping.yaml")
    for name in ("TransposeBatchMatMul.csv", "FusedInferAttentionScore.csv"):
        shutil.copy(FIA_DB / name, root / name)
    opts = load_op_mapping(root).get("tensor_cast.mlapo.default").extra["decomposer_options"]
    tables: dict[str, list[dict]] = {}
    for kernel, row in mlapo_rows(tensorcast_call("tensor_cast.mlapo.default"),
                                  opts["kv_cache_query"]["block_size"]):
        if kernel not in skip:
            tables.setdefault(kernel, []).append(row)
    for kernel, rows in tables.items():
        with open(root / f"{kernel}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
    return root


@pytest.fixture(scope="module")
def full(a3, tmp_path_factory):
    return v3_decode_step(a3, write_database(tmp_path_factory.mktemp("mlapo")))


def test_perfcasts_mlapo_call_is_tensorcasts():
    # the rows come from TensorCast's call; the query from perfcast's: same inputs
    tc = tensorcast_call("tensor_cast.mlapo.default")
    assert [tuple(s) for s, _ in tc["inputs"]] == [
        (4, 7168), (1, 4, 64), (1, 4, 64), (1536, 7168), (1536,), (3072, 1536), (576, 7168),
        (512,)]


def test_mlapo_is_a_full_measured_hit_on_every_layer(full):
    for est in measured_per_layer(full, "tensor_cast.mlapo.default", MLAPO_US, 43.0e-6):
        subs = json.loads(est.statistics["sub_kernel_shapes"])
        assert [s["kernel_shapes"] for s in subs] == [
            "4,7168;2112,7168", "4,1536;1536", "4,1536;3072,1536",
            "4,1,1,576;512;4,1,1,64;4,1,1,64;4;1135,128,1,64;1135,128,1,512"]
        assert subs[3]["shape_match_rule"] == "cache_pool_dim0_agnostic"


def test_m1_of_the_mla_ops(full):
    # mlapo and MLA hit; concat_and_cache_mla is not in the CANN 8.5 mapping (unmapped,
    # priced analytically, as TensorCast does with that mapping): 2 of 3 calls per layer
    collector = MetricsCollector()
    collector.collect_from_costed(full.costed)
    mla_ops = ("tensor_cast.mlapo.default", "tensor_cast.concat_and_cache_mla.default",
               "tensor_cast.multihead_latent_attention.default")
    recs = [r for r in collector.records if r.func_name in mla_ops]
    sub = MetricsCollector()
    sub.collect_from_records(recs)
    assert sub.m1() == {"m1_hit": 122, "m1_miss": 61, "m1_total": 183,
                        "m1_raw_op_count_hr": pytest.approx(2 / 3)}
    assert {(r.func_name, r.hit, r.reason) for r in recs} == {
        ("tensor_cast.mlapo.default", True, ""),
        ("tensor_cast.multihead_latent_attention.default", True, ""),
        ("tensor_cast.concat_and_cache_mla.default", False, "unmapped")}
    core = full.costed.by_lineage()["L3-60.mla.core"].resolution.estimate
    assert core.latency_s == pytest.approx(MLA_US * 1e-6)
    write = full.costed.by_lineage()["L3-60.mla.kv_cache_write"].resolution.estimate
    assert write.provider != "profiling" and write.latency_s > 0


def test_partial_mlapo_prices_the_missing_cache_kernel(a3, tmp_path):
    # without KvRmsNormRopeCache.csv three sub-kernels hit; the fourth is priced by the
    # analytic model from its stated work (never left out) and the op counts as a miss
    step = v3_decode_step(a3, write_database(tmp_path, skip=("KvRmsNormRopeCache",)))
    est = step.costed.by_lineage()["L3-60.mla.mlapo"].resolution.estimate
    s = est.statistics
    assert s["source"] == "PARTIAL" and s["missed_kernels"] == "KvRmsNormRopeCache"
    assert s["measured_latency_s"] == pytest.approx(35.0e-6)
    assert s["analytic_sub_kernels_s"] > 0
    assert est.latency_s == pytest.approx(35.0e-6 + s["analytic_sub_kernels_s"])
    collector = MetricsCollector()
    collector.collect_from_costed(step.costed)
    recs = [r for r in collector.records if r.func_name == "tensor_cast.mlapo.default"]
    assert recs and {r.reason for r in recs} == {"partial:KvRmsNormRopeCache"}


def test_cache_rows_match_on_semantics_not_pool_capacity(a3, tmp_path):
    db = write_database(tmp_path)
    ds = ProfilingDataSource(db, a3, ParallelPlan(tp=8))
    call = tensorcast_call("tensor_cast.mlapo.default")
    ins = [(s, "bf16") for s, _ in call["inputs"]]
    assert ds.lookup(op("tensor_cast.mlapo.default", ins)).source.name == "MEASURED"
    # 8 tokens: the MatMulV2 / RmsNorm / cache rows of 4 tokens do not answer
    eight = [((8, *s[1:]) if i == 0 else (1, 8, 64) if i in (1, 2) else s, d)
             for i, (s, d) in enumerate(ins)]
    r = ds.lookup(op("tensor_cast.mlapo.default", eight))
    assert "sub_kernel_miss:MatMulV2,RmsNorm,MatMulV2,KvRmsNormRopeCache" in str(r)
    # a cache row of another block size is not read
    text = (db / "KvRmsNormRopeCache.csv").read_text().replace(",128,", ",64,")
    (db / "KvRmsNormRopeCache.csv").write_text(text)
    r = ProfilingDataSource(db, a3, ParallelPlan(tp=8)).lookup(
        op("tensor_cast.mlapo.default", ins))
    assert r.source.name == "PARTIAL" and r.details["missed_kernels"] == ["KvRmsNormRopeCache"]


def test_decomposer_follows_the_mappings_cache_query():
    ins = [((4, 7168), "bf16"), ((1, 4, 64), "bf16"), ((1, 4, 64), "bf16"),
           ((1536, 7168), "bf16"), ((1536,), "bf16"), ((3072, 1536), "bf16"),
           ((576, 7168), "bf16"), ((512,), "bf16")]
    call = op("tensor_cast.mlapo.default", ins)

    def entry(**fields):
        return parse_operator_mapping("tensor_cast.mlapo.default",
                                      {"composite": True, "decomposer": True, **fields}, "t")
    # an older mapping without kv_cache_query: the exact (T,1,1,kv_proj) lookup
    last = decompose_mlapo(call, entry())[-1]
    assert last.kernel_type == "KvRmsNormRopeCache" and last.input_shapes == ((4, 1, 1, 576),)
    assert last.tc_input_count == 1
    cache = decompose_mlapo(call, entry(decomposer_options={
        "kv_cache_query": {"mode": "pool_dim0_agnostic", "block_size": 128}}))[-1]
    assert cache.inputs[4] == ((4,), "int64") and cache.input_shapes[5][1:] == (128, 1, 64)
    with pytest.raises(ConfigError, match="kv_cache_query.mode"):
        decompose_mlapo(call, entry(decomposer_options={"kv_cache_query": {"mode": "other"}}))
    # no q_lora (q_proj instead of q_a_proj / norm / q_b_proj): TensorCast declines too
    assert decompose_mlapo(op("tensor_cast.mlapo.default", ins[:3] + ins[5:]), entry()) is None


def test_a_mapping_that_declares_the_cache_write_absorbed_prices_it_zero(a3, tmp_path):
    # TensorCast's RFC rule for v0.18 (concat_and_cache_mla absorbed by
    # KvRmsNormRopeCache) as a mapping entry: then a declared zero, not an analytic cost
    import yaml
    db = write_database(tmp_path)
    doc = yaml.safe_load((db / "op_mapping.yaml").read_text())
    assert "tensor_cast.concat_and_cache_mla.default" not in doc["operator_mappings"]
    doc["operator_mappings"]["tensor_cast.concat_and_cache_mla.default"] = {
        "accepted_miss": "cache write done by KvRmsNormRopeCache inside mlapo"}
    (db / "op_mapping.yaml").write_text(yaml.safe_dump(doc))
    step = v3_decode_step(a3, db)
    est = step.costed.by_lineage()["L3-60.mla.kv_cache_write"].resolution.estimate
    assert est.provider == "profiling" and est.latency_s == 0.0
    assert est.match_kind.value == "declared"
