"""docs/support-matrix.md is generated from code and covers every reference config."""

import json
from pathlib import Path

import pytest

from perfcast.workload.families import FAMILIES
from perfcast.workload.support_matrix import (
    UNSUPPORTED_FEATURES,
    config_rows,
    render,
    support_row,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO.parent / "shared" / "reference" / "model_configs"
DOC = REPO / "docs" / "support-matrix.md"

needs_configs = pytest.mark.skipif(not CONFIGS.is_dir(),
                                   reason=f"reference configs not present at {CONFIGS}")


@needs_configs
def test_checked_in_matrix_equals_generated():
    assert DOC.read_text(encoding="utf-8") == render(CONFIGS), (
        "docs/support-matrix.md is stale: run python -m perfcast.workload.support_matrix")


@needs_configs
def test_every_reference_config_listed_with_status_and_reason():
    rows = config_rows(CONFIGS)
    names = [r.config for r in rows]
    assert len(names) == len(set(names))
    configs = {p.name for p in CONFIGS.glob("*_config.json")
               if not p.name.endswith("_hf_quant_config.json")}
    assert configs <= set(names)
    doc = DOC.read_text(encoding="utf-8")
    for r in rows:
        assert f"| {r.config} |" in doc
        if not r.supported:
            assert r.reason, r.config
        else:
            assert r.params_b > 0 and r.features
    assert str(CONFIGS.parent) not in doc  # no machine-specific paths
    # the frontier families of this issue are supported
    ok = {r.config for r in rows if r.supported}
    for name in ("Qwen--Qwen3.5-397B-A17B_config.json", "deepseek-ai--DeepSeek-V3.2_config.json",
                 "zai-org--GLM-5_config.json", "zai-org--GLM-5.2_config.json"):
        assert name in ok


def test_unsupported_reasons_are_for_types_without_a_family():
    assert not set(UNSUPPORTED_FEATURES) & set(FAMILIES)


def test_row_reasons_for_unknown_and_listed_types(tmp_path):
    cfg = {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 10}
    (tmp_path / "a_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    row = support_row(tmp_path / "a_config.json")
    assert not row.supported and "Mamba-2" in row.reason
    cfg["model_type"] = "brand_new"
    (tmp_path / "b_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    row = support_row(tmp_path / "b_config.json")
    assert not row.supported and row.reason == "model_type 'brand_new' has no family"
