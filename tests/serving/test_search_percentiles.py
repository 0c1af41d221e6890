"""`perfcast search` reports p50 / p90 / p99 of TTFT and TPOT for every configuration
(JSON rows and candidates, the table), whichever statistic the SLOs are judged on, and
says when that statistic is the default mean."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from perfcast.cli.main import app

ARGS = ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", "--isl", "256", "--osl", "16",
        "--concurrency", "2,16", "--tp-sizes", "1", "--modes", "agg", "--executor", "inline",
        "--max-tpot-ms", "1000"]


def _run(*extra):
    res = CliRunner().invoke(app, [*ARGS, *extra])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_every_configuration_row_carries_the_percentiles_of_its_candidate():
    doc = json.loads(_run("--slo-percentile", "90", "--format", "json"))
    assert doc["slo"]["statistic"] == "p90"
    by_key = {(c["layout"], c["concurrency"]): c for c in doc["top"]}
    assert len(doc["configurations"]) == 2 and len(by_key) == 2
    for row in doc["configurations"]:
        m = by_key[(row["layout"], row["concurrency"])]["metrics"]
        assert row["ttft_ms"] == m["ttft_ms"]["p90"] and row["tpot_ms"] == m["tpot_ms"]["p90"]
        for key in ("ttft", "tpot"):
            got = row[f"{key}_percentiles_ms"]
            assert got == {k: m[f"{key}_ms"][k] for k in ("p50", "p90", "p99")}
            assert got["p50"] <= got["p90"] <= got["p99"]
    # C=16 requests queue behind each other's prefills: their TTFT spreads
    c16 = next(r for r in doc["configurations"] if r["concurrency"] == 16)
    assert c16["ttft_percentiles_ms"]["p99"] > c16["ttft_percentiles_ms"]["p50"]


def test_table_lists_the_percentiles_and_names_the_default_statistic():
    doc = json.loads(_run("--format", "json"))
    table = _run()
    assert "judged on the mean" in table and "(the default;" in table
    assert "TTFT p50/p90/p99" in table and "TPOT p50/p90/p99" in table
    for row in doc["configurations"]:
        t, p = row["ttft_percentiles_ms"], row["tpot_percentiles_ms"]
        assert f"{t['p50']:.1f}/{t['p90']:.1f}/{t['p99']:.1f}" in table
        assert f"{p['p50']:.2f}/{p['p90']:.2f}/{p['p99']:.2f}" in table
    p99 = _run("--slo-percentile", "99")
    assert "judged on the p99" in p99 and "(the default;" not in p99
    assert "TTFT, TPOT: p99, ms" in p99
