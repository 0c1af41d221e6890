"""Pipelining in serving: stage split of the costed graph, the shared stage occupancy,
virtual engines of disjoint requests, against closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.serving.backends import KVCacheConfig, SchedulerConfig, load_backend
from perfcast.serving.deploy import Pool, ServeConfig, kv_capacity_tokens, run_serving
from perfcast.serving.engine import Engine
from perfcast.serving.pipeline import (
    PipelinedCost,
    StagedPart,
    StagedStepCostModel,
    StageOccupancy,
    StageTimes,
    pipeline_report,
    stage_split,
    virtual_engines,
)
from perfcast.serving.requests import ClosedLoopClient, LengthDistribution, OpenLoopClient
from perfcast.serving.simulator import simulate
from perfcast.serving.step_cost import ZERO, Part, StepCostModel, StepShape
from perfcast.workload import Batch, ParallelPlan, TaskKind, load_model_spec
from perfcast.workload.build import build_task_graph
from tests.serving.fakes import LinearCost, engine

MS = 1e-3


# -- the stage split of one graph ---------------------------------------------------------
def test_stage_split_puts_each_task_on_its_stage_and_the_p2p_transfer_on_its_link():
    model = load_model_spec("meta-llama/Llama-3.1-8B")
    graph = build_task_graph(model, ParallelPlan(pp=2), Batch.decode(8, 512))
    tasks = [t for t in graph.tasks if t.kind is not TaskKind.VIEW]
    # one call of a task lasts (index + 1) microseconds: every task distinguishable
    costed = [(t, (i + 1) * 1e-6) for i, t in enumerate(tasks)]
    part = stage_split(costed, 2)
    p2p = [i for i, t in enumerate(tasks) if t.lineage.startswith("pp.send_recv")]
    assert len(p2p) == 1 and tasks[p2p[0]].stage == 1
    # slots: stage 0, stage 1, link into stage 0 (none), link into stage 1
    assert part.slot_s[2] == part.slot_kernels[2] == 0.0
    assert part.slot_s[3] == pytest.approx((p2p[0] + 1) * 1e-6 * tasks[p2p[0]].count)
    assert part.slot_kernels[3] == tasks[p2p[0]].count
    for s in (0, 1):
        own = [(t, lat) for i, (t, lat) in enumerate(costed) if t.stage == s and i not in p2p]
        assert part.slot_s[s] == pytest.approx(sum(lat * t.count for t, lat in own))
        assert part.slot_kernels[s] == sum(t.count for t, _ in own)
    assert part.kernel_s == pytest.approx(sum(lat * t.count for t, lat in costed))
    assert part.kernels == sum(t.count for t in tasks)
    assert part.comm_s == pytest.approx(sum(lat * t.count for t, lat in costed
                                            if t.kind is TaskKind.COMMUNICATION))
    # the embedding runs on the first stage, the LM head on the last
    assert {t.stage for t in tasks if "embed" in t.lineage} == {0}
    assert {t.stage for t in tasks if "lm_head" in t.lineage} == {1}


def test_staged_parts_add_subtract_and_scale_slot_by_slot():
    a = StagedPart(3.0, 3.0, 0.5, (1.0, 1.5, 0.0, 0.5), (1.0, 1.0, 0.0, 1.0))
    b = StagedPart(6.0, 2.0, 2.0, (2.0, 2.0, 0.0, 2.0), (1.0, 0.0, 0.0, 1.0))
    s = a + b
    assert (s.kernel_s, s.kernels, s.comm_s) == (9.0, 5.0, 2.5)
    assert s.slot_s == (3.0, 3.5, 0.0, 2.5) and s.slot_kernels == (2.0, 1.0, 0.0, 2.0)
    d = b - a
    assert d.slot_s == (1.0, 0.5, 0.0, 1.5) and d.slot_kernels == (0.0, -1.0, 0.0, 0.0)
    assert d.kernel_s == 3.0
    h = a.scaled(0.5)
    assert h.slot_s == (0.5, 0.75, 0.0, 0.25) and h.kernels == 1.5
    # the zero Part (an empty LM-head term, an interpolation's start) keeps the split
    assert ZERO + a == a and a + ZERO == a and (a - ZERO) == a
    assert (ZERO - a).slot_s == (-1.0, -1.5, 0.0, -0.5)
    with pytest.raises(TypeError):
        a + Part(1.0, 1.0)


# -- the shared stages, by hand --------------------------------------------------------------
def _loop(occ: StageOccupancy, times: StageTimes, engines: int, iterations: int):
    """`engines` virtual engines, each starting its next iteration when its last one
    ended, in start-time order (as the simulator advances them)."""
    clocks = [0.0] * engines
    ends: list[list[float]] = [[] for _ in range(engines)]
    for _ in range(iterations * engines):
        i = min(range(engines), key=clocks.__getitem__)
        clocks[i] = occ.reserve(clocks[i], times)
        ends[i].append(clocks[i])
    return ends


def test_an_idle_pipeline_runs_an_iteration_in_its_serial_time():
    occ = StageOccupancy(3)
    times = StageTimes(0.5 * MS, (2 * MS, 3 * MS, 1 * MS), (0.0, 0.1 * MS, 0.2 * MS))
    assert occ.reserve(10.0, times) == pytest.approx(10.0 + times.serial_s)
    assert times.serial_s == pytest.approx(6.8 * MS)
    assert occ.busy_s == pytest.approx([2 * MS, 3 * MS, 1 * MS])


def test_uniform_stages_keep_the_serial_latency_per_engine_and_pp_times_the_throughput():
    """PP = 2, stages of 5 ms, 1 ms host, 0.2 ms p2p: L = 11.2 ms >= 2 x 5 ms, so both
    virtual engines iterate every L (the second one s later): two micro-batches per L
    instead of one."""
    s, host, link = 5 * MS, 1 * MS, 0.2 * MS
    times = StageTimes(host, (s, s), (0.0, link))
    latency = times.serial_s
    occ = StageOccupancy(2)
    ends = _loop(occ, times, engines=2, iterations=50)
    for e in ends:
        assert np.diff(e) == pytest.approx(np.full(49, latency))
    assert ends[1][0] - ends[0][0] == pytest.approx(s)
    # stage 0 works 2 s out of every L: bubble 1 - 2s/L on both stages in steady state
    span = occ.span_s
    assert span == pytest.approx(ends[1][-1] - host)
    assert occ.stage_bubble_fraction() == pytest.approx([1 - 100 * s / span] * 2)


def test_three_uniform_stages_three_engines_fill_the_pipeline():
    s = 4 * MS
    occ = StageOccupancy(3)
    ends = _loop(occ, StageTimes(0.0, (s, s, s), (0.0, 0.0, 0.0)), engines=3, iterations=40)
    for e in ends:
        assert np.diff(e) == pytest.approx(np.full(39, 3 * s))   # the serial latency
    # every stage busy from its first to its last micro-batch: the only bubble is
    # fill and drain, 2 s of the span on stages 0 and 2 ((p - 1) s in total per stage)
    span = occ.span_s
    assert span == pytest.approx(120 * s + 2 * s)
    assert occ.bubble_fraction() == pytest.approx(1 - 3 * 120 * s / (3 * span))


def test_a_slow_stage_sets_the_period_to_pp_times_its_time():
    """Stages of a = 1 ms and b = 3 ms, two engines: stage 1 runs back to back, each
    engine gets a token every 2 b = 6 ms (not a + b = 4 ms); stage 0 idles 1 - a/b of
    the time, the pipeline (b - a) / 2b in steady state."""
    a, b, n = 1 * MS, 3 * MS, 200
    occ = StageOccupancy(2)
    ends = _loop(occ, StageTimes(0.0, (a, b), (0.0, 0.0)), engines=2, iterations=n // 2)
    for e in ends:
        assert np.diff(e)[1:] == pytest.approx(np.full(n // 2 - 2, 2 * b))
    assert occ.span_s == pytest.approx(a + n * b)                 # stage 1 never waits
    assert occ.stage_bubble_fraction() == pytest.approx([1 - n * a / (a + n * b),
                                                         1 - n * b / (a + n * b)])
    assert occ.bubble_fraction() == pytest.approx(1 - n * (a + b) / (2 * (a + n * b)))
    assert occ.bubble_fraction() == pytest.approx((b - a) / (2 * b), abs=2e-3)


def test_the_occupancy_refuses_stage_times_of_another_pipeline():
    with pytest.raises(ValueError):
        StageOccupancy(2).reserve(0.0, StageTimes(0.0, (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)))


class _Stages:
    """Stage times linear in the step's tokens: stage j takes a_j + b_j x tokens."""

    def __init__(self, fixed_s, per_token_s, host_s=0.0, link_s=0.0):
        self.fixed, self.per_token, self.host, self.link = fixed_s, per_token_s, host_s, link_s

    def stage_times(self, shape: StepShape) -> StageTimes:
        n = len(self.fixed)
        return StageTimes(self.host, tuple(a + b * shape.tokens for a, b in
                                           zip(self.fixed, self.per_token)),
                          (0.0,) + (self.link,) * (n - 1))

    def decode_run_times(self, requests: int, context0: float, steps: int):
        return [self.stage_times(StepShape(requests, context0 + i)) for i in range(steps)]


def test_a_decode_run_stops_before_the_limit_and_counts_stage_waits():
    occ = StageOccupancy(2)
    pipe = PipelinedCost(_Stages((2 * MS, 2 * MS), (0.0, 0.0)), occ)
    # another engine's micro-batch holds stage 0 until 3 ms
    occ.free_s[0] = 3 * MS
    runs = pipe.decode_run(0.0, 4, 100.0, steps=10, limit_s=12 * MS)
    # first: waits 3 ms, then 2 + 2 -> ends at 7 ms; then 4 ms each: 11, 15 (starts at 11 < 12)
    assert runs == pytest.approx([7 * MS, 4 * MS, 4 * MS])
    assert len(pipe.decode_run(20 * MS, 4, 100.0, steps=5, limit_s=0.0)) == 1


# -- virtual engines in the simulator -----------------------------------------------------------
A, B = 0.010, 0.0001   # serial iteration: 10 ms + 0.1 ms per token


def _virtual(stages, cost, pp: int, *, chunked=True):
    """`pp` virtual engines of one replica on `stages` (a stage-time model)."""
    pipe = PipelinedCost(stages, StageOccupancy(pp))
    sched = SchedulerConfig(policy="decode_first", token_budget=100_000,
                            max_running_requests=1024, chunked_prefill=chunked)
    kv = KVCacheConfig(admission="reserve_full", block_tokens=1)
    return [Engine(f"r0.mb{v}", cost, sched, kv, 10**9, pipeline=pipe, replica="r0")
            for v in range(pp)]


def _closed(c: int, osl: int, waves: int = 4):
    return ClosedLoopClient(c, LengthDistribution(16, osl), num_requests=c * waves)


@pytest.mark.parametrize("pp", [2, 3])
def test_uniform_stages_give_pp_times_the_decode_throughput_at_the_serial_latency(pp):
    """Each stage costs 1/PP of the serial iteration A + B x tokens. PP virtual engines
    with C clients each against one engine with C: the same micro-batch shape, every
    token gap (ITL p50) the serial decode iteration, PP times the tokens (prefill
    waves of one virtual engine briefly delay the others: 1-2 %)."""
    c, osl = 16, 400
    serial = simulate(_closed(c, osl), [engine(LinearCost(A, B))], num_gpus=1).metrics
    stages = _Stages((A / pp,) * pp, (B / pp,) * pp)
    piped = simulate(_closed(pp * c, osl), _virtual(stages, LinearCost(A, B), pp),
                     num_gpus=pp).metrics
    decode = A + B * c
    assert serial.itl_ms["p50"] == pytest.approx(decode * 1e3)
    assert piped.itl_ms["p50"] == pytest.approx(decode * 1e3)
    assert piped.tpot_ms["mean"] == pytest.approx(serial.tpot_ms["mean"], rel=0.02)
    assert piped.throughput_tokens_per_s == pytest.approx(pp * serial.throughput_tokens_per_s,
                                                          rel=0.02)
    assert piped.completed_requests == pp * c * 4


def test_a_slow_stage_sets_every_virtual_engines_period_and_the_bubble():
    """Stages of 1 ms and 3 ms (no per-token cost): alone, an iteration takes 4 ms;
    two busy virtual engines each get a token every 2 x 3 = 6 ms; stage 0 idles 2/3 of
    the time, the pipeline 1/3."""
    a, b, osl = 1 * MS, 3 * MS, 500
    stages = _Stages((a, b), (0.0, 0.0))
    alone = simulate(_closed(1, osl, waves=1), _virtual(stages, LinearCost(a + b, 0.0), 2)[:1],
                     num_gpus=2)
    assert alone.metrics.itl_ms["p50"] == pytest.approx((a + b) * 1e3)
    engines = _virtual(stages, LinearCost(a + b, 0.0), 2)
    m = simulate(_closed(16, osl), engines, num_gpus=2).metrics
    assert m.itl_ms["p50"] == pytest.approx(2 * b * 1e3)
    assert m.throughput_tokens_per_s == pytest.approx(16 / (2 * b), rel=0.01)
    report = pipeline_report(engines)
    assert report["stages"] == 2 and report["micro_batches_in_flight_max"] == 2
    assert report["stage_bubble_fraction"] == pytest.approx([1 - a / b, 0.0], abs=0.01)
    assert report["bubble_fraction"] == pytest.approx((b - a) / (2 * b), abs=0.01)


def test_virtual_engines_of_a_replica_share_one_front_end():
    """A burst of 8 arrivals at a front-end serving 30 ms per request: one front-end
    per replica, whatever its virtual engines, so the k-th request's turn ends at
    k x 30 ms (mean wait 135 ms; two front-ends would give 75 ms)."""
    stages = _Stages((A / 2, A / 2), (B / 2, B / 2))
    client = OpenLoopClient(LengthDistribution(16, 4), 8, arrival_times_s=[0.0] * 8)
    m = simulate(client, _virtual(stages, LinearCost(A, B), 2), num_gpus=2,
                 frontend_service_s=0.030).metrics
    assert m.frontend_queue_ms["mean"] == pytest.approx(30.0 * 4.5, rel=1e-9)


# -- the real step model: stage split of the costed graph ------------------------------------------
@pytest.fixture(scope="module")
def llama_pp2():
    system = load_system("h100_sxm")
    model = load_model_spec("meta-llama/Llama-3.1-8B")
    backend = load_backend("vllm")
    resolver = build_resolver(system, launch_in_kernel_times=False)
    kw = dict(overheads=backend.overheads, cuda_graph=backend.cuda_graph)
    plan = ParallelPlan(pp=2)
    return (backend, StepCostModel(model, plan, system, resolver, **kw),
            StagedStepCostModel(model, plan, system, resolver, **kw))


def test_stage_times_add_up_to_the_serial_step_of_the_same_graphs(llama_pp2):
    _, serial, staged = llama_pp2
    for shape in (StepShape(8, 700.0), StepShape(1, 3.0), StepShape(5, 700.5),
                  StepShape(13, 0.5), StepShape(32, 2000.0, ((512, 0),)),
                  StepShape(0, 0.0, ((4096, 1024),))):
        times = staged.stage_times(shape)
        assert times.serial_s == pytest.approx(serial.step_s(shape), rel=1e-12)
        assert times.link_s[0] == 0.0 and times.link_s[1] > 0.0
        # stage 1 holds the LM head: it is the longer one for a decode step
        if not shape.prefill:
            assert times.stage_s[1] > times.stage_s[0]
    run = staged.decode_run_times(8, 700.0, 40)
    assert [t.serial_s for t in run] == pytest.approx(
        serial.decode_run_s(8, 700.0, 40).tolist(), rel=1e-12)
    for i in (0, 1, 17):
        assert run[i].stage_s == pytest.approx(staged.stage_times(StepShape(8, 700.0 + i)).stage_s,
                                               rel=1e-12)


def _engines(step, backend, pp: int):
    if pp == 1:
        return [Engine("agg0", step, backend.scheduler, backend.kv_cache, 10**7)]
    return virtual_engines("agg0", step, backend.scheduler, backend.kv_cache, 10**7)


def test_one_request_sees_the_serial_sum_of_the_stages(llama_pp2):
    """Concurrency 1: one virtual engine works, the other idles; TTFT and TPOT are those
    of the same PP = 2 graphs priced as the serial sum (the model before pipelining)."""
    backend, serial, staged = llama_pp2
    runs = [simulate(ClosedLoopClient(1, LengthDistribution(300, 50), 3), engines,
                     num_gpus=2).metrics
            for engines in (_engines(serial, backend, 1), _engines(staged, backend, 2))]
    assert runs[1].ttft_ms["mean"] == pytest.approx(runs[0].ttft_ms["mean"], rel=1e-9)
    assert runs[1].tpot_ms["mean"] == pytest.approx(runs[0].tpot_ms["mean"], rel=1e-9)


def test_two_virtual_engines_double_the_tokens_up_to_the_stage_imbalance(llama_pp2):
    """C clients on the serial model against 2 C on two virtual engines (C each): the
    micro-batch shape is the same, so each virtual engine's period is the serial
    latency L or 2 x the slower stage, whichever is longer: throughput x 2 L / period."""
    backend, serial, staged = llama_pp2
    c, osl = 8, 300
    one = simulate(_closed(c, osl, waves=3), _engines(serial, backend, 1), num_gpus=2).metrics
    two = simulate(_closed(2 * c, osl, waves=3), _engines(staged, backend, 2),
                   num_gpus=2).metrics
    times = staged.stage_times(StepShape(c, 16 + osl / 2))
    period = max(times.serial_s, 2 * max(times.stage_s))
    expected = 2 * times.serial_s / period
    assert 1.5 < expected < 2.0
    assert two.throughput_tokens_per_s / one.throughput_tokens_per_s == pytest.approx(
        expected, rel=0.03)


def test_pp1_deployments_build_no_pipeline_and_pp2_halves_each_engines_limits():
    backend = load_backend("vllm")

    def run(pp, workers=1):
        return run_serving(ServeConfig(model="Qwen/Qwen3-0.6B", backend=backend,
                                       pool=Pool(ParallelPlan(pp=pp), workers), isl=128,
                                       osl=16, concurrency=8, num_requests=16))

    one = run(1)
    assert [type(e.cost) for e in one.engines] == [StepCostModel]
    assert one.engines[0].pipeline is None and pipeline_report(one.engines) is None
    two = run(2, workers=2)
    assert [e.name for e in two.engines] == ["agg0.mb0", "agg0.mb1", "agg1.mb0", "agg1.mb1"]
    assert len({id(e.pipeline.occupancy) for e in two.engines}) == 2
    assert {e.replica for e in two.engines} == {"agg0", "agg1"}
    limit = backend.scheduler.max_running_requests
    assert all(e.sched.max_running_requests == limit // 2 for e in two.engines)
    assert all(e.sched.token_budget == backend.scheduler.token_budget for e in two.engines)
    # each virtual engine holds half of what one replica's KV cache holds
    full = kv_capacity_tokens(two.engines[0].cost, backend, context_hint=128 + 16)
    assert all(e.capacity == full // 2 for e in two.engines)
    report = pipeline_report(two.engines)
    assert report["pipelines"] == 2 and report["micro_batches"] > 0
    assert two.metrics.completed_requests == 16


# -- perfcast serve --pp-size ----------------------------------------------------------------------
def test_serve_reports_the_pipeline_for_pp2_and_nothing_for_pp1(tmp_path):
    import json

    from typer.testing import CliRunner

    from perfcast.cli.main import app

    def serve(*extra):
        return CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "8",
                                        "--isl", "256", "--osl", "32", *extra])

    one = serve("--format", "json")
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["pipeline"] is None
    trace = tmp_path / "trace.json"
    two = serve("--pp-size", "2", "--format", "json", "--chrome-trace", str(trace))
    assert two.exit_code == 0, two.output
    m = json.loads(two.stdout)
    p = m["pipeline"]
    assert p["stages"] == 2 and p["pipelines"] == 1 and p["micro_batches_in_flight_max"] == 2
    assert len(p["stage_busy_s"]) == len(p["stage_bubble_fraction"]) == 2
    assert 0.0 <= p["bubble_fraction"] < 1.0 and p["p2p_s"] > 0.0
    assert all(0.0 < b <= p["span_s"] for b in p["stage_busy_s"])
    assert m["completed_requests"] == 80 and m["inputs"]["layout"]["pp"] == 2
    assert json.loads(trace.read_text())["traceEvents"]
    table = serve("--pp-size", "2")
    assert table.exit_code == 0, table.output
    assert "pipeline bubble" in table.output
    spec = serve("--pp-size", "2", "--speculative", "ngram", "--num-speculative-tokens", "2",
                 "--acceptance", "1.5")
    assert spec.exit_code == 2 and "pipeline parallelism" in spec.output
