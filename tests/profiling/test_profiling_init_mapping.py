"""`perfcast profiling init-mapping`: an op_mapping.yaml skeleton from a model's graph and
the kernel CSVs of a database, validated as `profiling validate` does."""

import json
import shutil

import pytest
import yaml
from profiling_helpers import DB, FIA_DB, REAL_MAPPING
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.collect.init_mapping import (
    graph_operators,
    init_mapping,
    load_stack,
    model_graphs,
)
from perfcast.evidence.profiling.op_mapping import load_op_mapping
from perfcast.workload import ParallelPlan, load_model_spec

runner = CliRunner()


def _csvs_only(src, dst):
    """A database folder holding `src`'s CSVs (and comm sub-folders) but no mapping."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("op_mapping.yaml"))
    return dst


def _init(*args):
    return runner.invoke(app, ["profiling", "init-mapping", *args])


def _sections(path):
    """Entry name -> the section comment it was written under."""
    section, out = "", {}
    for line in path.read_text().splitlines():
        if line.startswith("  # ====="):
            section = line
        elif line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            out[line.strip().rstrip(":").strip("'\"")] = section
    return out


def test_shipped_stack_is_the_real_cann_8_5_mapping():
    from importlib import resources

    shipped = resources.files("perfcast.evidence.profiling").joinpath(
        "stacks", "vllm-ascend-0.18.yaml").read_bytes()
    assert shipped == REAL_MAPPING.read_bytes()
    assert load_stack("vllm-ascend-0.18")["cann_version"] == "8.5"


def test_stack_seeds_entries_cut_to_the_csvs_present(tmp_path):
    db = _csvs_only(DB, tmp_path / "db")
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(db), "--stack", "vllm-ascend-0.18",
              "--tp-size", "2", "--device", "ATLAS_800_A3_752T_128G_DIE")
    assert r.exit_code == 0, r.output
    assert "0 errors, 0 warnings" in r.output and "wrote" in r.output
    m = load_op_mapping(db)
    ref = yaml.safe_load(REAL_MAPPING.read_text())["operator_mappings"]
    mm = m.get("aten.mm.default")
    # reference: MatMulV2, alternates MatMulV3, MatMulCommon; the database has no MatMulCommon
    assert ref["aten.mm.default"]["alternate_kernel_types"] == ["MatMulV3", "MatMulCommon"]
    assert (mm.kernel_type, mm.alternate_kernel_types) == ("MatMulV2", ("MatMulV3",))
    assert "dropped (no CSV): MatMulCommon" in mm.notes
    assert m.get("aten.embedding.default").tc_input_count == ref["aten.embedding.default"][
        "tc_input_count"]
    attn = m.get("tensor_cast.attention.default")
    assert (attn.kernel_type, attn.query_mode) == ("FusedInferAttentionScore", "attention_special")
    assert m.get("tensor_cast.all_reduce.default").category == "communication"
    assert m.communication_data_ref == "hccl"
    assert {k: m.metadata[k] for k in ("device", "version", "cann_version")} == {
        "device": "ATLAS_800_A3_752T_128G_DIE", "version": "0.18.0", "cann_version": "8.5"}
    # every CSV is read by a forward entry or is a profiling-only placeholder, never both
    read = set()
    for e in m.operator_mappings.values():
        if not e.is_placeholder:
            read |= set(e.kernel_types) | set(e.sub_kernels)
    placeholders = {e.kernel_type for e in m.operator_mappings.values() if e.is_placeholder}
    stems = {p.stem for p in db.glob("*.csv")} | {p.stem for p in (db / "hccl").glob("*.csv")}
    assert placeholders == stems - read and "BatchMatMulV2" in placeholders
    assert "maps aten.bmm.default to it" in m.get("profiling.BatchMatMulV2").notes


def test_operators_without_kernel_evidence_are_todo_and_validate_fails(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / "MatMulV2.csv").write_text(
        "Input Shapes,Input Data Types,Input Formats,Average Duration(us)\n"
        "\"3,7;7,5\",DT_BF16;DT_BF16,ND;ND,1.5\n")
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(db))
    assert r.exit_code == 1, r.output
    m = load_op_mapping(db)
    mm = m.get("aten.mm.default")
    assert not mm.kernel_type and mm.notes.startswith("TODO (gemm")
    assert "operator_mappings.aten.mm.default: kernel_type is required" in r.output
    assert m.get("profiling.MatMulV2").kernel_type == "MatMulV2"
    # the exit code and report are `profiling validate`'s
    v = runner.invoke(app, ["profiling", "validate", str(db)])
    assert v.exit_code == 1 and v.output.splitlines()[-1] == r.output.splitlines()[-1]
    sections = _sections(db / "op_mapping.yaml")
    assert "TODO" in sections["aten.mm.default"]
    assert "Profiling-only" in sections["profiling.MatMulV2"]


def test_refuses_to_overwrite_without_force(tmp_path):
    db = _csvs_only(DB, tmp_path / "db")
    (db / "op_mapping.yaml").write_text("keep me\n")
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(db))
    assert r.exit_code == 2 and "--force" in r.output
    assert (db / "op_mapping.yaml").read_text() == "keep me\n"
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(db), "--force", "--stack",
              "vllm-ascend-0.18")
    assert r.exit_code == 0, r.output
    assert load_op_mapping(db).get("aten.mm.default").kernel_type == "MatMulV2"


def test_output_elsewhere_is_validated_against_the_database(tmp_path):
    db = _csvs_only(DB, tmp_path / "db")
    out = tmp_path / "draft.yaml"
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(db), "--stack", "vllm-ascend-0.18",
              "--output", str(out))
    assert r.exit_code == 0 and "0 errors" in r.output, r.output
    assert "declares no device" in r.output  # neither --device nor a manifest said
    assert not (db / "op_mapping.yaml").exists()
    assert load_op_mapping(out).get("aten.mm.default").kernel_type == "MatMulV2"
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(db), "--stack", "no-such-stack",
              "--output", str(tmp_path / "x.yaml"))
    assert r.exit_code == 2 and "vllm-ascend-0.18" in r.output


def test_bad_database_is_named(tmp_path):
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "--database" in r.output
    (tmp_path / "empty").mkdir()
    r = _init("--model", "Qwen/Qwen3-8B", "--database", str(tmp_path / "empty"))
    assert r.exit_code == 2 and "KernelType" in r.output


def test_decomposer_kernels_are_not_profiling_only(tmp_path):
    """The MLA decomposer reads FIA/TBMM at runtime: they are not placeholders."""
    db = _csvs_only(FIA_DB, tmp_path / "db")
    sk = init_mapping("deepseek-ai/DeepSeek-V3", db, stack="vllm-ascend-0.18",
                      device="ATLAS_800_A3_752T_128G_DIE", plan=ParallelPlan(tp=8))
    names = {e.name: e for e in sk.entries}
    mla = names["tensor_cast.multihead_latent_attention.default"]
    assert mla.section == "forward" and mla.fields["decomposer"] is True
    assert "profiling.FusedInferAttentionScore" not in names


def test_graph_operators_cover_both_phases():
    spec = load_model_spec("Qwen/Qwen3-8B")
    ops = graph_operators(model_graphs(spec, ParallelPlan(tp=2)))
    attn = ops["tensor_cast.attention.default"]
    assert len(attn.calls) == 2          # one prefill call shape, one decode call shape
    assert attn.count == 2 * spec.num_layers
    assert ops["tensor_cast.all_reduce.default"].kind == "communication"


def test_torch_profiler_database_maps_to_op_stems_and_answers(tmp_path):
    """torch.profiler trace -> collect parse -> init-mapping -> estimate: the GEMMs the
    trace recorded are answered from its `aten__mm` rows."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256,
        "torch_dtype": "float32"}))
    x, wqkv, wo = torch.randn(16, 64), torch.randn(64, 128), torch.randn(64, 64)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU],
                                         record_shapes=True) as prof:
        for _ in range(3):
            torch.mm(x, wqkv)
            torch.mm(x, wo)
    trace, db = tmp_path / "trace.json", tmp_path / "db"
    prof.export_chrome_trace(str(trace))
    assert runner.invoke(app, ["collect", "parse", "--profiling-path", str(trace),
                               "--database-path", str(db), "--device", "local_cpu"]
                         ).exit_code == 0
    r = _init("--model", str(cfg), "--database", str(db))
    m = load_op_mapping(db)
    assert m.device == "local_cpu"
    mm = m.get("aten.mm.default")
    assert mm.kernel_type == "aten__mm" and "up to the token count" in mm.notes
    assert r.exit_code == 1  # the tiny model's other operators are TODO
    clash = _init("--model", str(cfg), "--database", str(db), "--force", "--device", "h100_sxm")
    assert clash.exit_code == 2 and "local_cpu" in clash.output
    from pathlib import Path

    device = Path(__file__).resolve().parents[1] / "collect" / "fixtures" / "local_cpu.yaml"
    out = runner.invoke(app, ["estimate", str(cfg), "--device", str(device), "--dtype", "fp32",
                              "--num-queries", "1", "--query-length", "16",
                              "--performance-model", "profiling", "--profiling-database",
                              str(db), "--format", "json"])
    assert out.exit_code == 0, out.output
    ops = {op["lineage"]: op for op in json.loads(out.output)["ops"]}
    for lineage in ("L0-1.attn.qkv_proj", "L0-1.attn.o_proj"):
        assert (ops[lineage]["method"], ops[lineage]["provider"]) == ("measured", "profiling")
        assert ops[lineage]["statistics"]["kernel_type"] == "aten__mm"
    assert ops["L0-1.mlp.down_proj"]["provider"] == "roofline"   # (16,128)x(128,64): not traced
