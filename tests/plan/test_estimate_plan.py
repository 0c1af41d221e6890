"""The plan on real graphs: invariants, estimate JSON, Chrome trace and CLI."""

import json
from collections import defaultdict

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.report.chrome_trace import chrome_trace_events
from perfcast.report.step import step_json
from perfcast.workload import Batch, ParallelPlan

MODEL = "meta-llama/Llama-3.1-8B"


def run(**kw):
    kw.setdefault("plan", ParallelPlan(tp=2, pp=2))
    kw.setdefault("batch", Batch.prefill(4, 256))
    return estimate_step(EstimateRequest(model=MODEL, device="h100_sxm", **kw))


def test_a_dense_chain_without_microbatches_is_its_sum():
    for overlap in ("none", "comm"):
        r = run(overlap=overlap)
        assert r.latency_s == pytest.approx(r.sum_of_tasks_s, rel=1e-12)
        assert r.timeline.exposed_comm_s == pytest.approx(r.costed.comm_s(), rel=1e-9)


@pytest.mark.parametrize("kw", [dict(num_microbatches=4, full_timeline=True),
                                dict(num_microbatches=2, overlap="two-microbatch",
                                     full_timeline=True)])
def test_schedule_respects_dependencies_and_streams(kw):
    tl = run(**kw).timeline
    done = {(t.unit, t.lineage): t.end_s for t in tl.tasks}
    per_stream = defaultdict(list)
    for t in tl.tasks:
        per_stream[(t.stage, t.stream)].append((t.start_s, t.end_s))
    for spans in per_stream.values():
        spans.sort()
        for (_, e), (s, _) in zip(spans, spans[1:]):
            assert s >= e - 1e-15
    # per-layer deps: L{n}.x waits for what its costed task depends on in layer n
    checked = 0
    for t in tl.tasks:
        task = t.costed.task
        block = task.lineage.split(".", 1)[0] + "."  # e.g. "L0-15."
        layer = t.lineage.split(".", 1)[0] + "."     # e.g. "L7."
        for d in task.deps:
            dep = layer + d[len(block):] if task.layers and d.startswith(block) else d
            if (t.unit, dep) in done:
                assert t.start_s >= done[(t.unit, dep)] - 1e-15
                checked += 1
    assert checked > 0.9 * len(tl.tasks)
    assert tl.makespan_s <= tl.sum_of_tasks_s


def test_microbatches_and_overlap_buy_time_and_full_agrees_with_compressed():
    base = run()
    pp = run(num_microbatches=4)
    assert pp.latency_s < base.latency_s
    full = run(num_microbatches=4, full_timeline=True)
    assert full.latency_s == pytest.approx(pp.latency_s, rel=1e-9)  # chains: exact
    assert full.timeline.tasks[-1].lineage.startswith("final.")
    assert len(full.timeline.tasks) > len(pp.timeline.tasks)
    two = run(num_microbatches=2, overlap="two-microbatch", full_timeline=True)
    assert two.latency_s < two.timeline.sum_of_tasks_s
    assert two.timeline.exposed_comm_s < full.timeline.exposed_comm_s


def test_step_json_plan_section():
    r = run(num_microbatches=2)
    doc = step_json(r)
    plan = doc["plan"]
    assert doc["latency_s"] == plan["makespan_s"] == r.timeline.makespan_s
    assert doc["sum_of_tasks_s"] == pytest.approx(r.costed.sum_of_tasks_s())
    for key in ("makespan_s", "sum_of_tasks_s", "exposed_comm_s", "bubble_s", "critical_path"):
        assert key in plan
    assert plan["critical_path"][0] == "embed.lookup@mb0"
    assert plan["critical_path"][-1].startswith("final.")
    assert sum(op["latency_s"] for op in doc["ops"]) == pytest.approx(doc["sum_of_tasks_s"])
    json.dumps(doc)


def test_chrome_trace_structure():
    r = run(num_microbatches=2, overlap="two-microbatch", full_timeline=True)
    events = chrome_trace_events(r)
    meta = [e for e in events if e["ph"] == "M"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["ph"] for e in events} == {"M", "X"}
    assert len(spans) == len(r.timeline.tasks)
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta
               if e["name"] == "thread_name"}
    assert set(procs) == {0, 1}
    for e in spans:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
        assert (e["pid"], e["tid"]) in threads and isinstance(e["name"], str)
    names = set(threads.values())
    assert {"compute", "comm.nvlink"} <= names
    # overlap is visible: some comm span runs while a compute span runs on the same device
    comp = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in spans
            if threads[(e["pid"], e["tid"])] == "compute"]
    comm = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in spans
            if threads[(e["pid"], e["tid"])] == "comm.nvlink"]
    assert any(p == q and a < d and c < b for p, a, b in comm[:50] for q, c, d in comp)
    json.dumps({"traceEvents": events})


def test_cli_plan_options_and_trace(tmp_path):
    trace = tmp_path / "t.json"
    res = CliRunner().invoke(app, [
        "estimate", MODEL, "--tp-size", "2", "--pp-size", "2", "--num-queries", "4",
        "--query-length", "128", "--num-microbatches", "2", "--pp-schedule", "1f1b",
        "--overlap", "comm", "--format", "json", "--chrome-trace", str(trace)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["plan"]["pp_schedule"] == "1f1b" and doc["plan"]["full_timeline"] is True
    assert doc["latency_s"] == doc["plan"]["makespan_s"] < doc["plan"]["sum_of_tasks_s"]
    trace_doc = json.loads(trace.read_text())
    assert trace_doc["traceEvents"] and trace_doc["otherData"]["num_microbatches"] == 2
    bad = CliRunner().invoke(app, ["estimate", MODEL, "--pp-schedule", "zigzag"])
    assert bad.exit_code != 0 and "gpipe | 1f1b" in bad.output
    table = CliRunner().invoke(app, ["estimate", MODEL, "--query-length", "64"])
    assert table.exit_code == 0 and "plan makespan" in table.output
    assert "plain sum of tasks" in table.output


@pytest.mark.parametrize("overlap,rel", [("none", 1e-9), ("comm", 1e-9), ("two-microbatch", 0.03)])
def test_compressed_agrees_with_full_on_uneven_stages(overlap, rel):
    # 32 layers over 3 stages: 11, 11, 10 (compressed keeps the extra layer for real)
    kw = dict(plan=ParallelPlan(tp=2, pp=3), batch=Batch.prefill(12, 256), num_microbatches=3,
              overlap=overlap)
    compressed, full = run(**kw).timeline, run(full_timeline=True, **kw).timeline
    assert compressed.extrapolated_layers == 10
    assert compressed.makespan_s == pytest.approx(full.makespan_s, rel=rel)
    assert compressed.sum_of_tasks_s == pytest.approx(full.sum_of_tasks_s, rel=1e-12)
    assert compressed.bubble_s == pytest.approx(full.bubble_s, rel=max(rel, 1e-6) * 10)
