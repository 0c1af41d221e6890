"""Speed of `estimate_step` on MoE/MLA models, in process, after warm-up.

Target (issue 3): a DeepSeek-V3 decode step (batch 256, context 4096) on 8 devices,
TP8 or EP8 with attention DP, in under 50 ms. Prints the median and best of N runs.

    .venv/bin/python benchmarks/workload_speed.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec

CASES = [
    ("deepseek-ai/DeepSeek-V3", "TP8", ParallelPlan(tp=8)),
    ("deepseek-ai/DeepSeek-V3", "EP8 + attention-DP8", ParallelPlan(dp=8, ep=8)),
    ("deepseek-ai/DeepSeek-V3", "TP8 + EP8", ParallelPlan(tp=8, ep=8)),
    ("Qwen/Qwen3-235B-A22B", "EP8 + attention-DP8", ParallelPlan(dp=8, ep=8)),
    ("openai/gpt-oss-120b", "TP8", ParallelPlan(tp=8)),
    # frontier families (issue 9)
    ("Qwen/Qwen3.5-397B-A17B", "EP8 + attention-DP8", ParallelPlan(dp=8, ep=8)),
    ("deepseek-ai/DeepSeek-V3.2", "EP8 + attention-DP8", ParallelPlan(dp=8, ep=8)),
    ("zai-org/GLM-5", "TP8", ParallelPlan(tp=8)),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "TP8 + EP8", ParallelPlan(tp=8, ep=8)),
]


def time_case(model: str, plan: ParallelPlan, repeats: int, fresh_resolver: bool):
    spec = load_model_spec(model)
    system = load_system("h200_sxm")
    batch = Batch.decode(256, 4096)
    request = EstimateRequest(model=spec, device=system, plan=plan, batch=batch)
    resolver = build_resolver(system)
    estimate_step(request, resolver)  # warm-up: imports, caches
    step_s, build_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = estimate_step(request, build_resolver(system) if fresh_resolver else resolver)
        step_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        build_task_graph(spec, plan, batch)
        build_s.append(time.perf_counter() - t0)
    return result, step_s, build_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"{'model':26} {'layout':22} {'tasks':>5} {'estimate_step median':>21} "
          f"{'best':>8} {'fresh resolver':>15} {'graph build':>12}")
    for model, label, plan in CASES:
        result, warm, build = time_case(model, plan, args.repeats, fresh_resolver=False)
        _, fresh, _ = time_case(model, plan, max(3, args.repeats // 4), fresh_resolver=True)
        print(f"{model:26} {label:22} {len(result.graph.tasks):5d} "
              f"{statistics.median(warm) * 1e3:18.2f} ms {min(warm) * 1e3:5.2f} ms "
              f"{statistics.median(fresh) * 1e3:12.2f} ms {statistics.median(build) * 1e3:9.2f} ms")


if __name__ == "__main__":
    main()
