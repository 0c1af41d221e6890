"""`estimate --implementation auto`: the kernel the runtime's dispatch rules pick."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from typer.testing import CliRunner

from perfcast.cli.main import app

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"
LLAMA = (Path(__file__).resolve().parents[2] / "src" / "perfcast" / "workload"
         / "model_catalog" / "meta-llama--Llama-3.1-8B.json")


def _folder(tmp_path: Path) -> Path:
    """An AIConfigurator folder whose vLLM 0.24.0 GEMM table holds the public table's
    fp8_block rows of the three kernels vLLM dispatches between."""
    target = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.24.0"
    target.mkdir(parents=True)
    shutil.copy(FIX / "h100_sxm" / "gemm" / "vllm" / "0.24.0" / "collection_meta.yaml", target)
    table = pcsv.read_csv(FIX / "vllm_0.24.0_h100_fp8_block_kernels.csv")
    pq.write_table(table.cast(pa.schema([f if f.name != "version" else
                                         pa.field("version", pa.string())
                                         for f in table.schema])),
                   target / "gemm_perf.parquet")
    return tmp_path / "h100_sxm"


def _model(tmp_path: Path) -> Path:
    cfg = json.loads(LLAMA.read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    path = tmp_path / "llama-fp8-block" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return path


def _estimate(model: Path, evidence: Path, queries: int, *extra):
    out = CliRunner().invoke(app, [
        "estimate", str(model), "--device", "h100_sxm", "--decode", "--num-queries",
        str(queries), "--query-length", "1", "--context-length", "512",
        "--evidence", str(evidence),
        "--runtime", "vllm", "--format", "json", *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def _o_proj(doc):
    return next(op for op in doc["ops"] if op["group"] == "attn.o_proj")


def test_auto_picks_the_kernel_vllm_dispatches_per_m(tmp_path):
    model, evidence = _model(tmp_path), _folder(tmp_path)
    auto = ("--runtime-version", "0.24.0", "--implementation", "auto")
    small = _o_proj(_estimate(model, evidence, 8, *auto))
    assert small["provider"] in ("database", "interpolation")
    assert any("FlashInferFp8BlockScaledMMKernel" in a and "flashinfer_swapab_small_m" in a
               for a in small["assumptions"])
    large = _o_proj(_estimate(model, evidence, 64, *auto))
    assert any("DeepGemmFp8BlockScaledMMKernel" in a for a in large["assumptions"])


def test_auto_needs_a_runtime(tmp_path):
    out = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.1-8B", "--device",
                                   "h100_sxm", "--evidence", str(_folder(tmp_path)),
                                   "--implementation", "auto"])
    assert out.exit_code == 2 and "--runtime" in out.output


def test_table_output_names_the_aiconfigurator_tables(tmp_path):
    # a root of system folders is read in place (no snapshot digest to show)
    model, root = _model(tmp_path), _folder(tmp_path).parent
    out = CliRunner().invoke(app, [
        "estimate", str(model), "--device", "h100_sxm", "--decode", "--num-queries", "8",
        "--query-length", "1", "--context-length", "512", "--evidence", str(root),
        "--runtime", "vllm", "--runtime-version", "0.12.0", "--implementation", "auto"])
    assert out.exit_code == 0, out.output
    assert (f"evidence: {root} (AIConfigurator tables of h100_sxm, vllm 0.24.0 for "
            "vllm 0.12.0)") in " ".join(out.output.split())
