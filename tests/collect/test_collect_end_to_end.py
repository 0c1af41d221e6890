"""torch.profiler on a tiny CPU model -> collect parse -> collect grid (tiny config) ->
collect replay on CPU -> collect import -> `perfcast estimate --evidence`: the model's GEMM
and attention tasks are answered (method measured) by exactly the replayed rows."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256,
        "torch_dtype": "float32", "hidden_act": "silu"}
KERNEL_TYPES = ["aten::linear", "aten::scaled_dot_product_attention"]
runner = CliRunner()


def _cli(*args):
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def profile_tiny_block(path):
    """One attention block + MLP of the tiny config in plain torch, profiled on CPU."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    h, heads, kv, d, inter = 64, 4, 2, 16, 128
    qkv = torch.nn.Linear(h, (heads + 2 * kv) * d, bias=False)
    o = torch.nn.Linear(heads * d, h, bias=False)
    up = torch.nn.Linear(h, 2 * inter, bias=False)
    down = torch.nn.Linear(inter, h, bias=False)
    x = torch.randn(16, h)

    def block(x):
        q, k, v = qkv(x).split([heads * d, kv * d, kv * d], dim=-1)
        q = q.view(1, 16, heads, d).transpose(1, 2)
        k = k.view(1, 16, kv, d).transpose(1, 2)
        v = v.view(1, 16, kv, d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + o(a.transpose(1, 2).reshape(16, heads * d))
        g, u = up(x).chunk(2, dim=-1)
        return x + down(F.silu(g) * u)

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU],
                                         record_shapes=True) as prof:
        for _ in range(3):
            block(x)
    prof.export_chrome_trace(str(path))


def test_profile_parse_grid_replay_import(tmp_path):
    pytest.importorskip("torch")
    from perfcast.collect.tables import read_table

    trace, db, cfg = tmp_path / "trace.json", tmp_path / "db", tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY))
    profile_tiny_block(trace)

    _cli("collect", "parse", "--profiling-path", str(trace), "--database-path", str(db),
         "--device", "local_cpu")
    linear_before = read_table(db / "aten__linear.csv").rows
    assert {r["Input Shapes"] for r in linear_before} == {
        "16,64;128,64", "16,64;64,64", "16,64;256,64", "16,128;64,128"}

    _cli("collect", "grid", "--database-path", str(db), "--target-models", str(cfg),
         "--rows", "0", "--tp-sizes", "1", "--max-memory-gb", "0.001",
         "--ops", "aten__linear,aten__scaled_dot_product_attention")
    out = _cli("collect", "replay", "--database-path", str(db), "--update-mode", "missing-only",
               "--ops", "aten::linear,aten::scaled_dot_product_attention",  # names or stems
               "--repeat-count", "3", "--warmup", "1", "--num-threads", "1")
    assert ", 0 failed," in out

    snapshot = tmp_path / "evidence"
    out = _cli("collect", "import", "--database-path", str(db), "--output", str(snapshot),
               "--hardware", "local_cpu", "--runtime", "torch",
               "--kernel-types", ",".join(KERNEL_TYPES))
    assert "saved to" in out
    device = Path(__file__).parent / "fixtures" / "local_cpu.yaml"
    out = _cli("estimate", str(cfg), "--device", str(device), "--dtype", "fp32",
               "--num-queries", "1", "--query-length", "32",     # shapes only the grid has
               "--evidence", str(snapshot), "--runtime", "torch", "--evidence-policy", "exact",
               "--store", str(tmp_path / "store"), "--format", "json")
    ops = json.loads(out)["ops"]
    replayed = {(name, i + 2) for name in ("aten__linear.csv",
                                           "aten__scaled_dot_product_attention.csv")
                for i, r in enumerate(read_table(db / name).rows) if r.get("MicroBench Count")}
    measured = [op for op in ops if op["method"] == "measured"]
    # qkv, attention, o, gate_up, down, lm_head; norms, rope, ... stay analytic
    assert sorted(op["group"] for op in measured) == sorted([
        "attn.qkv_proj", "attn.core", "attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj",
        "final.lm_head"])
    assert all(op["method"] == "analytical" for op in ops if op not in measured)
    for op in measured:
        (rid,) = op["raw_record_ids"]
        file, row = rid.split("#row")
        assert (file, int(row)) in replayed                      # a row the replay measured
        r = read_table(db / file).rows[int(row) - 2]
        assert (r["MicroBench Backend"], r["MicroBench Device"]) == ("cpu", "local_cpu")
        assert op["avg_latency_s"] == pytest.approx(float(r["Average Duration(us)"]) * 1e-6)
