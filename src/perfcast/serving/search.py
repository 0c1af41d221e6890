"""SLO-constrained configuration search: sweep layouts, concurrency and agg vs disagg
for a GPU budget; keep the configurations that meet the TTFT/TPOT limits; report the
Pareto frontier of tokens/s/GPU against tokens/s/user and the top-N.

Each candidate layout (mode, TP/attention-DP/EP per pool, worker counts) is one task
that simulates every concurrency with a shared step-cost cache. Tasks run in local
processes (`executor="local"`), inline (`"inline"`), or on a Ray cluster (`"ray"`,
optional extra: `pip install ray`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.serving.backends import load_backend
from perfcast.serving.deploy import Pool, ServeConfig, StepModelCache, run_serving
from perfcast.workload import ModelSpec, ParallelPlan, load_model_spec

EXECUTORS = ("local", "inline", "ray")


@dataclass(frozen=True)
class SearchSpace:
    model: str | ModelSpec
    system: str = "h100_sxm"
    backend: str = "vllm"
    backend_version: str = ""
    # fitted host overheads ((Overheads field, seconds), ...) from a calibration revision
    overheads: tuple[tuple[str, float], ...] = ()
    # calibrated analytic providers, asked after measured evidence, before physics
    extra_providers: tuple = ()
    gpus: int = 8
    isl: int = 1024
    osl: int = 256
    range_ratio: float = 0.8
    concurrencies: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    dp_sizes: tuple[int, ...] = (1,)
    ep_sizes: tuple[int, ...] = (1,)
    modes: tuple[str, ...] = ("agg", "disagg")
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    prompts_per_concurrency: int = 5
    evidence_root: str | None = None


@dataclass(frozen=True)
class Layout:
    mode: str
    plan: ParallelPlan
    workers: int
    decode_plan: ParallelPlan | None = None
    decode_workers: int = 0

    @property
    def gpus(self) -> int:
        d = self.decode_plan.num_devices * self.decode_workers if self.decode_plan else 0
        return self.plan.num_devices * self.workers + d

    def label(self) -> str:
        def p(plan: ParallelPlan) -> str:
            s = f"tp{plan.tp}"
            if plan.dp > 1:
                s += f"dp{plan.dp}"
            if plan.ep > 1:
                s += f"ep{plan.ep}"
            return s
        if self.mode == "agg":
            return f"agg {self.workers}x{p(self.plan)}"
        return (f"disagg P {self.workers}x{p(self.plan)} + D "
                f"{self.decode_workers}x{p(self.decode_plan)}")


@dataclass
class Candidate:
    layout: str
    mode: str
    gpus: int
    concurrency: int
    metrics: dict = field(default_factory=dict)
    error: str = ""
    meets_slo: bool = False
    pareto: bool = False


def _plans(space: SearchSpace, limit: int) -> list[ParallelPlan]:
    out = []
    for tp in space.tp_sizes:
        for dp in space.dp_sizes:
            for ep in space.ep_sizes:
                if tp * dp > limit or (tp * dp) % ep:
                    continue
                try:
                    out.append(ParallelPlan(tp=tp, dp=dp, ep=ep))
                except ConfigError:
                    continue
    return out


def layouts(space: SearchSpace) -> list[Layout]:
    """Agg: replicas of one layout filling the budget. Disagg: one prefill layout and
    one decode layout with worker counts that use the whole budget."""
    out: list[Layout] = []
    plans = _plans(space, space.gpus)
    if "agg" in space.modes:
        for plan in plans:
            if space.gpus % plan.num_devices == 0:
                out.append(Layout("agg", plan, space.gpus // plan.num_devices))
    if "disagg" in space.modes:
        for pp in plans:
            for dp in plans:
                for pw in range(1, space.gpus // pp.num_devices + 1):
                    rest = space.gpus - pw * pp.num_devices
                    if rest <= 0 or rest % dp.num_devices:
                        continue
                    out.append(Layout("disagg", pp, pw, dp, rest // dp.num_devices))
    return out


@functools.lru_cache(maxsize=4)
def _evidence(root: str, system: str, backend: str, version: str):
    from perfcast.serving.evidence import evidence_loader

    return evidence_loader(Path(root))(system, backend, version)


def evaluate_layout(space: SearchSpace, layout: Layout) -> list[Candidate]:
    """Simulate one layout at every concurrency of the space (one shared cost cache)."""
    model = space.model if isinstance(space.model, ModelSpec) else load_model_spec(space.model)
    providers, context = (), None
    if space.evidence_root:
        from perfcast.hardware import load_system

        ev = _evidence(space.evidence_root, load_system(space.system).name, space.backend,
                       space.backend_version)
        providers, context = ev.providers, (ev.context if ev.providers else None)
    providers = (*providers, *space.extra_providers)
    cache = StepModelCache()
    out = []
    for c in space.concurrencies:
        cand = Candidate(layout.label(), layout.mode, layout.gpus, c)
        backend = load_backend(space.backend).with_overheads(**dict(space.overheads))
        cfg = ServeConfig(model=model, system=space.system, backend=backend,
                          backend_version=space.backend_version, mode=layout.mode,
                          pool=Pool(layout.plan, layout.workers),
                          decode_pool=(Pool(layout.decode_plan, layout.decode_workers)
                                       if layout.decode_plan else None),
                          isl=space.isl, osl=space.osl, range_ratio=space.range_ratio,
                          concurrency=c, num_requests=space.prompts_per_concurrency * c)
        try:
            res = run_serving(cfg, evidence=providers, evidence_context=context, cache=cache)
            cand.metrics = res.metrics.to_json()
            if res.metrics.rejected_requests:
                cand.error = res.rejected[0].reject_reason
        except PerfcastError as exc:
            cand.error = str(exc)
        out.append(cand)
    return out


def _run_task(args: tuple[SearchSpace, Layout]) -> list[Candidate]:
    return evaluate_layout(*args)


def run_tasks(space: SearchSpace, todo: Sequence[Layout], executor: str,
              workers: int | None) -> list[Candidate]:
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}", field="--executor",
                          expected=" | ".join(EXECUTORS))
    tasks = [(space, lay) for lay in todo]
    if executor == "inline" or len(tasks) <= 1:
        results = [_run_task(t) for t in tasks]
    elif executor == "local":
        from concurrent.futures import ProcessPoolExecutor

        n = workers or max(1, min(len(tasks), os.cpu_count() or 1))
        with ProcessPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(_run_task, tasks))
    else:
        try:
            import ray
        except ImportError:
            raise ConfigError("Ray is not installed", field="--executor",
                              expected="`pip install ray` or --executor local") from None
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False)
        remote = ray.remote(_run_task)
        results = ray.get([remote.remote(t) for t in tasks])
    return [c for group in results for c in group]


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Candidates no other candidate beats on both tokens/s/GPU and tokens/s/user."""
    pts = [c for c in cands if c.meets_slo]
    front = []
    for c in pts:
        g, u = c.metrics["tokens_per_s_per_gpu"], c.metrics["tokens_per_s_per_user"]
        dominated = any(o is not c and o.metrics["tokens_per_s_per_gpu"] >= g
                        and o.metrics["tokens_per_s_per_user"] >= u
                        and (o.metrics["tokens_per_s_per_gpu"] > g
                             or o.metrics["tokens_per_s_per_user"] > u) for o in pts)
        if not dominated:
            front.append(c)
    return sorted(front, key=lambda c: c.metrics["tokens_per_s_per_user"])


def search(space: SearchSpace, *, executor: str = "local",
           workers: int | None = None) -> list[Candidate]:
    todo = layouts(space)
    if not todo:
        raise ConfigError(f"no layout fits {space.gpus} GPUs with TP in {space.tp_sizes}",
                          field="--gpus", expected="a budget that some layout divides")
    cands = run_tasks(space, todo, executor, workers)
    for c in cands:
        if c.error or not c.metrics:
            continue
        ttft, tpot = c.metrics["ttft_ms"]["mean"], c.metrics["tpot_ms"]["mean"]
        c.meets_slo = ((space.max_ttft_ms is None or (ttft is not None and ttft <= space.max_ttft_ms))
                       and (space.max_tpot_ms is None
                            or (tpot is not None and tpot <= space.max_tpot_ms)))
    for c in pareto_front(cands):
        c.pareto = True
    return cands


def top(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    ok = [c for c in cands if c.meets_slo]
    return sorted(ok, key=lambda c: -c.metrics["tokens_per_s_per_gpu"])[:n]


def candidate_json(c: Candidate) -> dict:
    d = asdict(c)
    return d
