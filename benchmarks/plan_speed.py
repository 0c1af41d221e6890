"""Speed of plan-level scheduling (issue 7 targets: full < 200 ms, compressed < 10 ms).

Workload: Llama-3.1-70B, TP8 x PP2 on h100_sxm, prefill of 8 requests x 1024 tokens in
8 microbatches (one request each; two-microbatch overlap: 4 microbatches x 2 halves).
Times `schedule_plan` alone (the costed microbatch
graph is built once, as `estimate_step` does) and the whole `estimate_step`.

    .venv/bin/python benchmarks/plan_speed.py [--repeat 11]
"""

from __future__ import annotations

import argparse
import statistics
import time

from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.evidence.factory import build_resolver
from perfcast.evidence.costing import cost_graph
from perfcast.hardware import load_system
from perfcast.plan import OverlapMode, PlanOptions, schedule_plan, split_batch
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec

MODEL = "meta-llama/Llama-3.1-70B"
PLAN = ParallelPlan(tp=8, pp=2)
BATCH = Batch.prefill(8, 1024)
MICROBATCHES = 8


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=11)
    args = ap.parse_args()
    system = load_system("h100_sxm")
    model = load_model_spec(MODEL)
    resolver = build_resolver(system)
    print(f"{MODEL} TP{PLAN.tp} PP{PLAN.pp} prefill {BATCH.num_requests}x"
          f"{BATCH.segments[0].q_tokens} tokens on {system.name}; median of {args.repeat}")
    print(f"{'overlap':<18}{'mode':<12}{'instances':>10}{'schedule ms':>13}{'makespan ms':>13}"
          f"{'plain sum ms':>14}{'bubble':>8}{'exposed comm ms':>17}")
    for overlap, n_mb in (("comm", MICROBATCHES), ("two-microbatch", MICROBATCHES // 2)):
        halves = OverlapMode(overlap).halves
        costed: dict = {}  # identical microbatches share one costed graph, as in estimate_step
        units = [costed.setdefault(b, cost_graph(build_task_graph(model, PLAN, b), system.name,
                                                 resolver))
                 for b in split_batch(BATCH, n_mb * halves)]
        for full in (True, False):
            opts = PlanOptions(num_microbatches=n_mb, overlap=overlap, full_timeline=full)
            schedule_plan(units, system, opts)  # warm-up
            sec, tl = timed(lambda: schedule_plan(units, system, opts), args.repeat)
            print(f"{f'{overlap} x{n_mb}':<18}{'full' if full else 'compressed':<12}"
                  f"{len(tl.tasks):>10}{sec * 1e3:>13.2f}{tl.makespan_s * 1e3:>13.3f}"
                  f"{tl.sum_of_tasks_s * 1e3:>14.3f}{tl.bubble_fraction:>8.1%}"
                  f"{tl.exposed_comm_s * 1e3:>17.3f}")
    for full in (False, True):
        req = EstimateRequest(model=MODEL, device=system, plan=PLAN, batch=BATCH,
                              num_microbatches=MICROBATCHES, full_timeline=full)
        sec, r = timed(lambda: estimate_step(req), args.repeat)
        print(f"estimate_step end to end ({'full' if full else 'compressed'} timeline, "
              f"{MICROBATCHES} microbatches): {sec * 1e3:.1f} ms, latency {r.latency_s * 1e3:.3f} ms"
              f" vs plain sum {r.sum_of_tasks_s * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
