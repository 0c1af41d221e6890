"""The cost-providers spec's seed API: `AIConfiguratorPerformanceImporter.from_file(path,
hardware_name=..., source_revision=...)` and the comparison oracles
(`VidurProfileBaseline`, `InferenceBaseline`) that a resolver can never install."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence import CostQuery, CostQueryContext, CostResolver, CostSubject
from perfcast.evidence.importers.aiconfigurator import AIConfiguratorPerformanceImporter
from perfcast.evidence.importers.vidur_baseline import InferenceBaseline, VidurProfileBaseline

FIXTURES = Path(__file__).parents[1] / "fixtures"
GEMM = FIXTURES / "aiconfigurator" / "h100_sxm" / "gemm" / "trtllm" / "1.3.0rc20" / \
    "gemm_perf.parquet"
VIDUR = FIXTURES / "vidur"
MLP = VIDUR / "h100_Llama-2-7b-hf_mlp.csv"
ATTN = VIDUR / "attention.csv"


def selectors(db, key):
    return {r.selector.get(key) for r in db.records()}


# -- AIConfiguratorPerformanceImporter.from_file as the spec calls it ---------------------
def test_from_file_as_the_spec_calls_it():
    db = AIConfiguratorPerformanceImporter.from_file(
        GEMM, hardware_name="h100-sxm", source_revision="8fc57cf")
    assert len(db) == pq.read_metadata(GEMM).num_rows
    assert {r.hardware for r in db.records()} == {"h100_sxm"}
    assert selectors(db, "runtime") == {"trtllm"}
    assert selectors(db, "runtime_revision") == {"1.3.0rc20"}
    assert {r.provenance.source_revision for r in db.records()} == {"8fc57cf"}
    assert db.sources[0]["runtime_from"] == "collection_meta.yaml"


def test_a_lone_table_takes_its_runtime_from_its_columns(tmp_path):
    lone = tmp_path / "gemm_perf.parquet"
    shutil.copy(GEMM, lone)
    db = AIConfiguratorPerformanceImporter.from_file(lone, hardware_name="h100_sxm",
                                                     source_revision="r")
    assert selectors(db, "runtime") == {"trtllm"}        # column value TRTLLM, lower case
    assert selectors(db, "runtime_revision") == {"1.3.0rc20"}
    assert db.sources[0]["runtime_from"] == "the framework column and the version column"


def _rewrite(tmp_path, edit) -> Path:
    table = edit(pq.read_table(GEMM))
    out = tmp_path / "gemm_perf.parquet"
    pq.write_table(table, out)
    return out


def test_a_table_that_names_no_runtime_is_an_error(tmp_path):
    bare = _rewrite(tmp_path, lambda t: t.drop_columns(["framework", "version"]))
    with pytest.raises(ConfigError) as exc:
        AIConfiguratorPerformanceImporter.from_file(bare, hardware_name="h100-sxm",
                                                    source_revision="r")
    assert exc.value.field == "framework" and "framework=" in str(exc.value)
    # stated by the caller, it imports
    db = AIConfiguratorPerformanceImporter.from_file(bare, hardware_name="h100-sxm",
                                                     framework="trtllm", version="1.3.0rc20")
    assert db.sources[0]["runtime_from"] == "the arguments"


def test_a_keyword_that_contradicts_the_file_is_an_error():
    with pytest.raises(ConfigError, match="collection_meta.yaml says version '1.3.0rc20', "
                                          "not '1.2.0'"):
        AIConfiguratorPerformanceImporter.from_file(GEMM, hardware_name="h100-sxm",
                                                    version="1.2.0")


def test_several_versions_in_one_table_are_an_error(tmp_path):
    def two_versions(t):
        i = t.column_names.index("version")
        values = ["1.3.0rc20"] * (t.num_rows - 1) + ["1.2.0rc5"]
        return t.set_column(i, "version", pa.array(values))
    mixed = _rewrite(tmp_path, two_versions)
    with pytest.raises(ConfigError) as exc:
        AIConfiguratorPerformanceImporter.from_file(mixed, hardware_name="h100-sxm")
    assert exc.value.field == "version" and "1.2.0rc5" in str(exc.value)


def test_hardware_names_are_checked():
    with pytest.raises(ConfigError) as exc:
        AIConfiguratorPerformanceImporter.from_file(GEMM, hardware_name="h100-sxm-ish")
    assert exc.value.field == "hardware_name"
    with pytest.raises(ConfigError, match="NVIDIA H100"):   # the device column says H100
        AIConfiguratorPerformanceImporter.from_file(GEMM, hardware_name="h200_sxm")


# -- VidurProfileBaseline / InferenceBaseline ----------------------------------------------
def baseline(**kw):
    args = dict(compute_csv=MLP, attention_csv=ATTN, hardware_name="h100-sxm",
                dtype="fp16", source_revision="vidur@abc123",
                attention_backend="AttentionBackend.FLASHINFER", block_size=16)
    return VidurProfileBaseline.from_csv(**{**args, **kw})


def gemm(m, n, k, **extra):
    return CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="h100_sxm",
                     dtype="fp16", dims=FrozenDict({"m": m, "n": n, "k": k, **extra}))


def test_lookup_answers_exact_matches_only():
    rows = list(csv.DictReader(MLP.open()))
    r = rows[0]   # Llama-2-7B, tp 1; rows 0 and 1 are two samples at 4096 tokens
    head_dim = int(r["n_embd"]) // int(r["n_head"])
    m, k = int(r["num_tokens"]), int(r["n_embd"])
    n = (int(r["n_head"]) + 2 * int(r["n_kv_head"])) * head_dim
    b = baseline()
    ref = b.lookup(gemm(m, n, k))
    samples = sorted(float(x["time_stats.attn_pre_proj.median"]) for x in rows
                     if x["num_tokens"] == r["num_tokens"])
    assert ref.latency_s == pytest.approx(sum(samples) / 2 * 1e-3)
    assert ref.baseline == "vidur_baseline" and ref.baseline_revision == b.revision
    assert ref.source_revision == "vidur@abc123"
    assert set(ref.raw_record_ids) == {f"{MLP.name}#0.attn_pre_proj",
                                       f"{MLP.name}#1.attn_pre_proj"}
    # between two profiled token counts: not covered (no nearest row, no interpolation)
    assert b.lookup(gemm(m - 16, n, k)) is None
    # a dim the profile does not control: not an exact match
    assert b.lookup(gemm(m, n, k, layout="nt")) is None
    # attention: the backend is the query's implementation
    attn = CostQuery(subject=CostSubject.OPERATOR, operation="attention", hardware="h100_sxm",
                     dtype="fp16", dims=FrozenDict({
                         "batch": 1, "q_tokens": 512, "kv_len": 512, "heads": 32,
                         "kv_heads": 32, "head_dim": 128, "v_head_dim": 128,
                         "kv_dtype": "fp16", "phase": "prefill"}),
                     context=CostQueryContext(implementation="AttentionBackend.FLASHINFER"))
    assert b.lookup(attn).latency_s == pytest.approx(0.25e-3)


def test_a_baseline_can_never_be_installed_in_a_resolver():
    b = baseline()
    assert isinstance(b, InferenceBaseline)
    assert not hasattr(b, "estimate") and not hasattr(b, "supports")
    with pytest.raises(TypeError, match="VidurProfileBaseline is a comparison oracle.*"
                                        "cannot install it"):
        CostResolver([b])
    from perfcast.evidence.factory import build_resolver
    from perfcast.hardware import load_system

    with pytest.raises(TypeError, match="comparison oracle"):
        build_resolver(load_system("h100_sxm"), [b])


def test_the_pinned_identity_is_checked_and_hashed():
    with pytest.raises(ConfigError) as exc:
        baseline(attention_backend="AttentionBackend.FLASH_ATTENTION")
    assert exc.value.field == "attention_backend" and "row 0 (line 2)" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        baseline(block_size=32)
    assert exc.value.field == "block_size"
    with pytest.raises(ConfigError) as exc:
        baseline(source_revision="")
    assert exc.value.field == "source_revision"
    with pytest.raises(ConfigError) as exc:
        baseline(attention_csv=MLP)          # a compute profile given as attention
    assert exc.value.field == "attention_csv"
    assert baseline(model_name="llama-2-7b").revision != baseline().revision
    assert baseline(attention_csv=None).revision != baseline().revision
