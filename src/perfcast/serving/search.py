"""SLO-constrained configuration search: sweep layouts, concurrency and agg vs disagg
for a GPU budget; keep the configurations that meet the TTFT/TPOT limits; report the
Pareto frontier of tokens/s/GPU against tokens/s/user and the top-N.

Each configuration is judged on one statistic of its requests' TTFT and TPOT
(`slo_statistic`: the mean, or p50 / p90 / p99); one that misses says why
(`Candidate.failures`) and by how much (`Candidate.slo_excess`: the largest ratio of a
statistic to its limit).

Each candidate layout (mode, TP/attention-DP/EP per pool, worker counts) is one task
that simulates every concurrency with a shared step-cost cache. Tasks run in local
processes (`executor="local"`), inline (`"inline"`), or on a Ray cluster (`"ray"`,
optional extra: `pip install ray`).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.core.executor import map_tasks
from perfcast.serving.backends import load_backend
from perfcast.serving.deploy import Pool, ServeConfig, StepModelCache, run_serving
from perfcast.serving.metrics import STAT_KEYS
from perfcast.serving.provenance import tallied
from perfcast.serving.requests import check_request_count
from perfcast.serving.speculative import SpeculativeConfig
from perfcast.workload import ModelSpec, ParallelPlan, load_model_spec

# why a configuration is not in the results (Candidate.failures)
FAILURE_REASONS = {
    "simulation_error": "the simulation failed (e.g. the weights leave no room for a KV cache)",
    "rejected_requests": "some requests can never fit the engine's KV cache",
    "ttft_above_slo": "TTFT above --max-ttft-ms",
    "tpot_above_slo": "TPOT above --max-tpot-ms",
}


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
    pp_sizes: tuple[int, ...] = (1,)
    dp_sizes: tuple[int, ...] = (1,)
    ep_sizes: tuple[int, ...] = (1,)
    modes: tuple[str, ...] = ("agg", "disagg")
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    slo_statistic: str = "mean"          # mean | p50 | p90 | p99 of each configuration
    prompts_per_concurrency: int = 5
    evidence_root: str | None = None
    allow_long_run: bool = False         # simulations above MAX_SIMULATED_REQUESTS
    prefix_cache_hit_rate: float | None = None   # as serve --prefix-cache-hit-rate
    speculative: SpeculativeConfig | None = None  # as serve --speculative (PP 1 layouts)
    stack: str = "auto"                  # as serve --stack (perfcast.workload.stacks)


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
            if plan.pp > 1:
                s += f"pp{plan.pp}"
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
    failures: tuple[str, ...] = ()       # keys of FAILURE_REASONS
    slo_excess: float | None = None      # max(statistic / limit) over the SLOs given
    # answers per provider of this layout's cost queries (provenance.Tally.rows())
    provenance: list = field(default_factory=list)
    cost_queries: int | None = None


def _plans(space: SearchSpace, limit: int) -> list[ParallelPlan]:
    out = []
    for tp in space.tp_sizes:
        for pp in space.pp_sizes:
            for dp in space.dp_sizes:
                for ep in space.ep_sizes:
                    if tp * pp * dp > limit or (tp * dp) % ep:
                        continue
                    try:
                        out.append(ParallelPlan(tp=tp, pp=pp, dp=dp, ep=ep))
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
    from perfcast.hardware import load_system

    providers, context = (), None
    if space.evidence_root:
        ev = _evidence(space.evidence_root, load_system(space.system).name, space.backend,
                       space.backend_version)
        providers, context = ev.providers, (ev.context if ev.providers else None)
    providers, tally = tallied((*providers, *space.extra_providers))
    cache = StepModelCache()
    out = []
    for c in space.concurrencies:
        cand = Candidate(layout.label(), layout.mode, layout.gpus, c)
        backend = load_backend(space.backend, space.backend_version,
                               system=load_system(space.system), tp=layout.plan.devices_per_stage,
                               pp=layout.plan.pp).with_overheads(**dict(space.overheads))
        cfg = ServeConfig(model=model, system=space.system, backend=backend,
                          backend_version=space.backend_version, mode=layout.mode,
                          pool=Pool(layout.plan, layout.workers),
                          decode_pool=(Pool(layout.decode_plan, layout.decode_workers)
                                       if layout.decode_plan else None),
                          isl=space.isl, osl=space.osl, range_ratio=space.range_ratio,
                          concurrency=c, num_requests=space.prompts_per_concurrency * c,
                          prefix_cache_hit_rate=space.prefix_cache_hit_rate,
                          speculative=space.speculative, stack=space.stack)
        try:
            res = run_serving(cfg, evidence=providers, evidence_context=context, cache=cache)
            cand.metrics = res.metrics.to_json()
            if res.metrics.rejected_requests:
                cand.error = res.rejected[0].reject_reason
                cand.failures = ("rejected_requests",)
        except PerfcastError as exc:
            cand.error = str(exc)
            cand.failures = ("simulation_error",)
        out.append(cand)
    for cand in out:   # the layout's step costs are shared by its concurrencies
        cand.provenance, cand.cost_queries = tally.rows(), tally.queries if providers else None
    return out


def _run_task(args: tuple[SearchSpace, Layout]) -> list[Candidate]:
    return evaluate_layout(*args)


def run_tasks(space: SearchSpace, todo: Sequence[Layout], executor: str,
              workers: int | None, on_done: Callable[[], None] | None = None
              ) -> list[Candidate]:
    """Evaluate every layout; `on_done()` is called as each one finishes."""
    done = on_done or (lambda: None)
    # the layouts with the most engines first (their simulations take longest), so the
    # last ones to start are short; results come back in the layouts' order
    order = sorted(range(len(todo)), key=lambda i: _engines(todo[i]), reverse=True)
    results = map_tasks(_run_task, [(space, todo[i]) for i in order], executor, workers,
                        lambda i: done())
    by_layout = [None] * len(todo)
    for i, group in zip(order, results):
        by_layout[i] = group
    return [c for group in by_layout for c in group]


def _engines(layout: Layout) -> tuple[int, int]:
    """(decoding engines, all engines) of a layout: what its simulations' length
    grows with."""
    decoding = layout.decode_workers if layout.mode == "disagg" else layout.workers
    return decoding, layout.workers + layout.decode_workers


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


def search(space: SearchSpace, *, executor: str = "local", workers: int | None = None,
           on_start: Callable[[int], None] | None = None,
           on_done: Callable[[], None] | None = None) -> list[Candidate]:
    """Evaluate the space; `on_start(layouts)` once the layouts are known, `on_done()`
    as each finishes (progress)."""
    if space.slo_statistic not in STAT_KEYS:
        raise ConfigError(f"unknown SLO statistic {space.slo_statistic!r}",
                          field="--slo-percentile", expected="mean, p50, p90 or p99")
    if space.prompts_per_concurrency < 1:
        raise ConfigError(f"is {space.prompts_per_concurrency}", field="prompts_per_concurrency",
                          expected="a positive integer")
    check_request_count(space.prompts_per_concurrency * max(space.concurrencies),
                        "--concurrency", space.allow_long_run)
    todo = layouts(space)
    if not todo:
        raise ConfigError(f"no layout fits {space.gpus} GPUs with TP in {space.tp_sizes}",
                          field="--gpus", expected="a budget that some layout divides")
    if on_start is not None:
        on_start(len(todo))
    cands = run_tasks(space, todo, executor, workers, on_done)
    for c in cands:
        judge(c, space)
    for c in pareto_front(cands):
        c.pareto = True
    return cands


def judge(c: Candidate, space: SearchSpace) -> None:
    """Set meets_slo, failures and slo_excess of one simulated configuration."""
    if c.error or not c.metrics:
        return
    stat = space.slo_statistic
    failures, excess = [], []
    for key, limit, reason in (("ttft_ms", space.max_ttft_ms, "ttft_above_slo"),
                               ("tpot_ms", space.max_tpot_ms, "tpot_above_slo")):
        if limit is None:
            continue
        value = c.metrics[key][stat]
        if value is None:   # no request produced it (e.g. every output is one token)
            failures.append(reason)
            continue
        excess.append(value / limit if limit > 0 else float("inf"))
        if value > limit:
            failures.append(reason)
    c.failures = tuple(failures)
    c.slo_excess = max(excess) if excess else None
    c.meets_slo = not failures


def failure_counts(cands: Sequence[Candidate]) -> dict[str, int]:
    """Configurations per failure reason (one configuration may miss both SLOs)."""
    counts = Counter(r for c in cands for r in c.failures)
    return {r: counts[r] for r in FAILURE_REASONS if counts[r]}


def nearest_misses(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    """When nothing meets the SLOs: the configurations closest to them (smallest
    largest ratio of statistic to limit)."""
    if any(c.meets_slo for c in cands):
        return []
    near = [c for c in cands if c.slo_excess is not None and not c.error]
    return sorted(near, key=lambda c: (c.slo_excess, -c.metrics["tokens_per_s_per_gpu"]))[:n]


def is_moe(model: ModelSpec) -> bool:
    from perfcast.workload.families.traits import has_routed_experts

    return has_routed_experts(model)


def default_ep_sizes(model: ModelSpec, tp_sizes: Sequence[int],
                     dp_sizes: Sequence[int]) -> tuple[int, ...]:
    """EP 1 for dense models; for MoE models also EP = TP x attention-DP of each layout
    (experts spread over every device of a replica, as MoE deployments usually run)."""
    if not is_moe(model):
        return (1,)
    return tuple(sorted({1, *(tp * dp for tp in tp_sizes for dp in dp_sizes)}))


def top(cands: Sequence[Candidate], n: int) -> list[Candidate]:
    ok = [c for c in cands if c.meets_slo]
    return sorted(ok, key=lambda c: -c.metrics["tokens_per_s_per_gpu"])[:n]


def candidate_json(c: Candidate) -> dict:
    """One configuration; provenance is reported once for the whole search."""
    d = asdict(c)
    del d["provenance"], d["cost_queries"]
    return d


def search_provenance(cands: Sequence[Candidate]) -> tuple[list[dict], int | None]:
    """Answers per provider summed over layouts (one Tally per layout: each candidate of
    a layout carries the same rows), and the distinct queries summed likewise."""
    seen: dict[str, Candidate] = {}
    for c in cands:
        seen.setdefault(c.layout, c)
    rows = [row for c in seen.values() for row in c.provenance]
    queries = [c.cost_queries for c in seen.values()]
    return rows, (None if not queries or None in queries else sum(queries))
