"""Vidur attention.csv (hand-written rows in Vidur's column layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQuery, CostQueryContext, CostSubject, Miss
from perfcast.evidence.importers.vidur import VidurProfileImporter
from perfcast.evidence.provider_db import PerformanceDatabaseProvider

ATTN = Path(__file__).parents[1] / "fixtures" / "vidur" / "attention.csv"
BACKEND = "AttentionBackend.FLASHINFER"


def _query(batch, q_tokens, kv_len, heads, phase, implementation=BACKEND):
    dims = {"batch": batch, "q_tokens": q_tokens, "kv_len": kv_len, "heads": heads,
            "kv_heads": heads, "head_dim": 128, "v_head_dim": 128, "kv_dtype": "fp16",
            "phase": phase}
    return CostQuery(subject=CostSubject.OPERATOR, operation="attention", hardware="h100_sxm",
                     dtype="fp16", dims=FrozenDict(dims),
                     context=CostQueryContext(implementation=implementation))


def test_prefill_and_decode_rows_map_to_attention_queries():
    db = VidurProfileImporter.from_csv(ATTN, hardware="h100_sxm", dtype="fp16")
    assert len(db) == 4
    p = PerformanceDatabaseProvider(db)
    # row 0: prefill chunk 512, no cache: q_tokens = kv_len = 512, 0.25 ms
    est = p.estimate(_query(1, 512, 512, 32, "prefill"))
    assert est.latency_s == pytest.approx(0.25e-3)
    assert est.raw_record_ids == ("attention.csv#0.attn_prefill",)
    # row 1: the same chunk after 512 cached tokens: kv_len 1024, 0.61 ms
    assert p.estimate(_query(1, 512, 1024, 32, "prefill")).latency_s == pytest.approx(0.61e-3)
    # rows 2, 3: decode, batch 8, 1024 cached: kv_len 1025; tp 2 halves the heads
    assert p.estimate(_query(8, 1, 1025, 32, "decode")).latency_s == pytest.approx(0.048e-3)
    assert p.estimate(_query(8, 1, 1025, 16, "decode")).latency_s == pytest.approx(0.031e-3)
    # the backend is a selector: a query naming another kernel (or none) does not hit
    assert isinstance(p.estimate(_query(1, 512, 512, 32, "prefill", "flash_attn")), Miss)
    assert isinstance(p.estimate(_query(1, 512, 512, 32, "prefill", "")), Miss)


def test_bad_attention_rows_name_the_line(tmp_path):
    lines = ATTN.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[3].split(",")
    cells[header.index("is_prefill")] = "maybe"
    bad = tmp_path / "attention.csv"
    bad.write_text("\n".join([lines[0], lines[1], lines[2], ",".join(cells)]) + "\n")
    with pytest.raises(ConfigError, match=r"field 'is_prefill': row 2 \(line 4\)"):
        VidurProfileImporter.from_csv(bad, hardware="h100_sxm", dtype="fp16")
    cells = lines[3].split(",")
    cells[header.index("time_stats.attn_decode.median")] = ""
    bad.write_text("\n".join([lines[0], ",".join(cells)]) + "\n")
    with pytest.raises(ConfigError, match=r"time_stats.attn_decode.median"):
        VidurProfileImporter.from_csv(bad, hardware="h100_sxm", dtype="fp16")
