"""Request traces: each public layout is read by its own column names and units, a bad
row names the file, line and column, and `serve --trace` replays arrivals and lengths.

The fixtures under tests/fixtures/traces are written by hand from each trace's published
description (see the README there), not produced by perfcast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.core.errors import ConfigError
from perfcast.serving.traces import read_trace

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"


def _rows(trace):
    return [(r.arrival_s, r.input_tokens, r.output_tokens, r.block_hashes)
            for r in trace.requests]


def test_mooncake_jsonl_times_are_milliseconds_and_hash_ids_are_kept():
    t = read_trace(TRACES / "mooncake.jsonl")
    assert t.layout == "mooncake" and t.block_tokens == 512 and t.has_block_hashes
    assert _rows(t) == [(0.0, 1500, 20, (0, 1, 2)), (0.0, 1200, 12, (0, 3, 4)),
                        (3.0, 1100, 30, (0, 1, 5)), (6.0, 600, 8, (0, 6))]


def test_azure_2023_and_2024_timestamps_are_datetimes_from_the_first_request():
    t23 = read_trace(TRACES / "azure_2023.csv")
    assert t23.layout == "azure"
    assert [r[:3] for r in _rows(t23)] == [(0.0, 2000, 15), (pytest.approx(0.25), 300, 9),
                                           (pytest.approx(1.0), 4100, 40)]
    # 2024: a zone suffix, and one time without a fraction
    t24 = read_trace(TRACES / "azure_2024.csv")
    assert [r[:3] for r in _rows(t24)] == [(0.0, 800, 3), (pytest.approx(0.25), 1600, 52),
                                           (pytest.approx(1.5), 120, 7)]


def test_burstgpt_seconds_from_the_first_request_and_failed_rows_left_out():
    t = read_trace(TRACES / "burstgpt.csv")
    assert t.layout == "burstgpt" and t.skipped_rows == 1
    # Timestamp 7, 9, 12 s (the 8 s row has 0 response tokens: a failed request)
    assert [r[:3] for r in _rows(t)] == [(0.0, 350, 120), (2.0, 1200, 64), (5.0, 40, 200)]


def test_plain_csv_is_the_mooncake_columns_in_milliseconds():
    t = read_trace(TRACES / "plain.csv")
    assert t.layout == "plain" and not t.has_block_hashes and t.block_tokens is None
    assert [r[:3] for r in _rows(t)] == [(0.0, 512, 32), (0.25, 1024, 16), (1.0, 256, 64)]


def test_rows_are_replayed_in_time_order_and_limit_reads_the_first_rows(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("timestamp,input_length,output_length\n2000,10,2\n1000,20,3\n3000,30,4\n")
    assert [r[:3] for r in _rows(read_trace(f))] == [(0.0, 20, 3), (1.0, 10, 2),
                                                     (2.0, 30, 4)]
    first = read_trace(f, limit=2)
    assert first.truncated and [r[1] for r in _rows(first)] == [20, 10]


@pytest.mark.parametrize("name, text, needles", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:20:07.1,100,5\n"
              "yesterday,100,5\n", ["a.csv", "line 3", "'TIMESTAMP'", "yesterday"]),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "1,ChatGPT,12.5,3,15.5,API log\n", ["b.csv", "line 2", "'Request tokens'"]),
    ("c.csv", "timestamp,input_length,output_length\n0,100,0\n",
     ["c.csv", "line 2", "'output_length'", "positive"]),
    ("d.csv", "timestamp,input_length,output_length\n0,100\n", ["d.csv", "line 2", "2 fields"]),
    ("e.csv", "time,prompt,completion\n0,1,1\n", ["e.csv", "no known trace layout",
                                                 "ContextTokens", "Request tokens"]),
    ("f.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 2, '
                '"hash_ids": [0, 1]}\n{"timestamp": 5, "input_length": 600, '
                '"output_length": 2, "hash_ids": [0, 1, 2]}\n',
     ["f.jsonl", "line 2", "'hash_ids'", "at most 2"]),
    ("g.jsonl", '{"timestamp": 0, "input_length": 6, "output_length": 2}\n{"timestamp": \n',
     ["g.jsonl", "line 2", "JSON"]),
    ("h.jsonl", '{"timestamp": 0, "input_len": 6, "output_length": 2}\n',
     ["h.jsonl", "line 1", "input_length"]),
    ("i.jsonl", '{"timestamp": -5, "input_length": 6, "output_length": 2}\n',
     ["i.jsonl", "line 1", "'timestamp'", "non-negative"]),
    ("j.csv", "", ["j.csv", "holds no requests"]),
    ("k.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "1,ChatGPT,12,0,12,API log\n", ["k.csv", "no requests", "1 failed"]),
])
def test_a_bad_trace_names_file_line_and_column(tmp_path, name, text, needles):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_trace(f)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


# -- serve --trace ---------------------------------------------------------------------------

def _serve(*args):
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_serve_replays_the_trace_arrivals_and_lengths():
    m = _serve("--trace", str(TRACES / "burstgpt.csv"))
    assert m["completed_requests"] == 3
    inp = m["inputs"]
    assert inp["client"]["kind"] == "trace_replay" and inp["client"]["num_requests"] == 3
    assert inp["client"]["isl"] is None          # lengths come from the trace
    assert inp["trace"]["layout"] == "burstgpt" and inp["trace"]["skipped_rows"] == 1
    assert inp["trace"]["mean_input_tokens"] == pytest.approx((350 + 1200 + 40) / 3)
    assert inp["prefix_cache"]["source"] == "none" and m["prefix_cache_hit_rate"] == 0.0
    # arrivals 0, 2 and 5 s apart: each request runs alone, so the run lasts from 0 s
    # to the last one's end, and the input throughput counts the trace's prompt tokens
    assert 5.0 < m["duration_s"] < 6.0
    assert m["input_throughput_tokens_per_s"] == pytest.approx(1590 / m["duration_s"])
    assert m["throughput_tokens_per_s"] == pytest.approx(384 / m["duration_s"])


def test_serve_trace_num_requests_takes_the_first_rows_and_warmup_is_excluded():
    m = _serve("--trace", str(TRACES / "mooncake.jsonl"), "--num-requests", "2",
               "--warmup-requests", "1")
    assert m["completed_requests"] == 2
    assert m["inputs"]["client"]["num_requests"] == 2


def test_serve_table_names_the_trace_and_its_lengths():
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--trace",
                                   str(TRACES / "azure_2023.csv")])
    assert res.exit_code == 0, res.output
    assert "trace replay, azure layout" in res.stdout
    assert "from the trace: mean input 2133, mean output 21 tokens" in res.stdout


@pytest.mark.parametrize("extra, flag", [
    (["--concurrency", "4"], "--concurrency"),
    (["--request-rate", "2"], "--request-rate"),
    (["--arrival-trace", "ARRIVALS"], "--arrival-trace"),
    (["--num-requests", "9"], "4 requests for 9"),
])
def test_trace_excludes_the_other_client_flags(tmp_path, extra, flag):
    arrivals = tmp_path / "arrivals.txt"
    arrivals.write_text("0\n1\n")
    args = [str(arrivals) if a == "ARRIVALS" else a for a in extra]
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--trace",
                                   str(TRACES / "mooncake.jsonl"), *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and flag in res.output, res.output


def test_a_bad_trace_is_a_normal_cli_error(tmp_path):
    f = tmp_path / "bad.csv"
    f.write_text("timestamp,input_length,output_length\n0,ten,4\n")
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--trace", str(f)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    for needle in (str(f), "line 2", "input_length"):
        assert needle in res.output


def test_arrival_trace_still_replays_arrival_times(tmp_path):
    f = tmp_path / "arrivals.txt"
    f.write_text("# seconds\n0\n0.5\n2\n")
    m = _serve("--arrival-trace", str(f), "--isl", "256", "--osl", "8")
    assert m["completed_requests"] == 3
    assert m["inputs"]["client"]["kind"] == "open_loop_trace"
    assert m["inputs"]["trace"] is None and m["inputs"]["client"]["isl"] == 256
