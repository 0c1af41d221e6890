"""Physical bounds a silicon row's measurement must respect (`perfcast validate
silicon`): a row whose TTFT and TPOT need less HBM traffic or more matrix math than its
devices allow, or more prefill time than the system's measured kernels take, contradicts
the deployment it describes and gets a reason, not a number."""

from __future__ import annotations

from collections.abc import Sequence

from perfcast.core.errors import UnresolvedCostError
from perfcast.evidence.contracts import CostProvider, CostQueryContext, EstimateMethod
from perfcast.evidence.queries import query_for_task
from perfcast.evidence.resolver import CostResolver
from perfcast.hardware import System, load_system
from perfcast.serving.deploy import ServeConfig
from perfcast.serving.step_cost import built_halves, stack_options
from perfcast.workload import Batch, ModelSpec, ParallelPlan, Precision, TaskKind
from perfcast.workload.build import build_task_graph
from perfcast.workload.families.traits import has_routed_experts
from perfcast.workload.stacks import resolve_stack


def closed_loop_in_decode(concurrency: int, osl: int, ttft_ms: float, tpot_ms: float) -> float:
    """Requests in their decode phase on average in a closed loop of `concurrency`
    clients, by Little's law: C x decode time / (TTFT + decode time), decode time
    (osl - 1) x TPOT. Below C by the share of each request's life before its first token
    (client, queue, prefill); a client-side cap shows up as a plateau (docs/serving.md)."""
    decode_ms = (osl - 1) * tpot_ms
    return concurrency * decode_ms / (ttft_ms + decode_ms)


def ttft_in_completion_gaps(concurrency: int, osl: int, ttft_ms: float, tpot_ms: float) -> float:
    """TTFT in units of the closed loop's mean time between completions,
    e2e / C = (TTFT + (osl - 1) x TPOT) / C; about 1 when each new request waits for the
    next completion before its first token."""
    return ttft_ms * concurrency / (ttft_ms + (osl - 1) * tpot_ms)


def below_memory_bound(cfg: ServeConfig, ttft_ms: float, tpot_ms: float) -> str | None:
    """Why a row's measurement contradicts the hardware, or None.

    A decode step reads at least every byte its tasks touch (weights, the experts its
    tokens reach, the KV cache of the prompts) through HBM, so its time is at least those
    bytes over the device's peak bandwidth, and TPOT (decode steps plus prefill stalls)
    is at least that. The requests in decode come from the row itself (Little's law on
    its TTFT and TPOT, `closed_loop_in_decode`), each with at least the prompt cached. A
    measured TPOT below that bound cannot be this deployment at this concurrency and
    these lengths (e.g. outputs that stopped early, or fewer clients than recorded).
    Disagg rows: the same bound on the decode pool (the requests in decode are there)."""
    if not cfg.concurrency or not isinstance(cfg.model, ModelSpec):
        return None
    if cfg.mode == "agg":
        pool = cfg.pool
    elif cfg.mode == "disagg" and cfg.decode_pool is not None:
        pool = cfg.decode_pool
    else:
        return None
    in_decode = closed_loop_in_decode(cfg.concurrency, cfg.osl, ttft_ms, tpot_ms)
    per_replica = max(1, int(in_decode / max(pool.workers, 1)))
    system = cfg.system if isinstance(cfg.system, System) else load_system(cfg.system)
    moved = _graph_sum("bytes", cfg.model, pool.plan, Batch.decode(per_replica, cfg.isl),
                       cfg.precision, system, _stack_of(cfg, system))
    bound_ms = 1e3 * moved / system.device.memory.bw_bytes_per_s
    if tpot_ms >= bound_ms:
        return None
    # the experts a step reads are the expected distinct ones of uniform routing, not
    # the fewest a router could pick: for MoE models the bound holds for that routing
    routing = (" (routed experts: the distinct ones uniform top-k routing reaches)"
               if has_routed_experts(cfg.model) else "")
    return (f"measured TPOT {tpot_ms:.2f} ms is below {bound_ms:.2f} ms, the time a decode "
            f"step of the {in_decode:.0f} requests the row's TTFT and TPOT put in decode "
            f"(Little's law) needs to move {moved / 1e9:.1f} GB per device at peak HBM "
            f"bandwidth{routing}: the measurement contradicts the deployment it describes")


# _graph_sum's and above_measured_prefill's values by content (rows of one deployment at
# other concurrencies ask the same graphs); bounded, cleared when full
_GRAPH_SUMS: dict[tuple, float | tuple[float, bool]] = {}
GRAPH_SUMS_MAX = 4096


def _stack_of(cfg: ServeConfig, system: System):
    """The operator stack the deployment's graphs are built under (its `--stack`)."""
    return resolve_stack(cfg.stack, system.device.vendor)


def _graph_sum(what: str, model: ModelSpec, plan: ParallelPlan, batch: Batch,
               precision: Precision | None, system: System, stack=None) -> float:
    """Over the compute tasks of `batch`'s graph under `stack` (`_stack_of`):
    the bytes they move (`bytes`), or their FLOPs at the system's peak rate for each
    task's engine and math dtype (`peak_s`), summed in graph order; memoised by the
    digests of model, plan and system and the stack's name (as `built_halves`)."""
    key = (what, model.digest, plan.digest, precision, batch, system.digest,
           None if stack is None else stack.name)
    hit = _GRAPH_SUMS.get(key)
    if hit is not None:
        return hit
    graph = build_task_graph(model, plan, batch, precision, **stack_options(stack))
    if what == "bytes":
        out = sum(t.work.bytes_total * t.count for t in graph.tasks
                  if t.kind is TaskKind.COMPUTE)
    else:
        out = 0.0
        for t in graph.tasks:
            if t.kind is TaskKind.COMPUTE:
                out += _peak_s(t, system) * t.count
    if len(_GRAPH_SUMS) >= GRAPH_SUMS_MAX:
        _GRAPH_SUMS.clear()
    _GRAPH_SUMS[key] = out
    return out


def _prefill_demand(cfg: ServeConfig, ttft_ms: float, tpot_ms: float
                    ) -> tuple[float, int, int, float] | None:
    """(completed requests per second, shortest prompt, attention-DP ranks, one-prompt-per-
    rank prefill steps per second and device) of a closed-loop row, or None.

    Requests complete at C / e2e per second (Little's law, for the requests' mean TTFT
    and TPOT), e2e = TTFT + (osl - 1) x TPOT with the row's largest output length (the
    mean is shorter, so this undercounts the rate); each prefilled at least
    `range_ratio x isl` tokens (the shortest prompt the harness samples)."""
    if not cfg.concurrency or not isinstance(cfg.model, ModelSpec):
        return None
    e2e_s = 1e-3 * (ttft_ms + max(cfg.osl - 1, 0) * tpot_ms)
    if e2e_s <= 0:
        return None
    rate = cfg.concurrency / e2e_s                     # requests per second, all pools
    prompt = max(1, int(cfg.range_ratio * cfg.isl))
    dp = max(1, cfg.pool.plan.dp)
    return rate, prompt, dp, rate / (dp * max(cfg.pool.workers, 1))


def above_compute_bound(cfg: ServeConfig, ttft_ms: float, tpot_ms: float) -> str | None:
    """Why a row's measured throughput needs more prefill math than the devices have,
    or None.

    Each completed request (`_prefill_demand`) needs its prompt's matrix work, which on
    a device takes at least its FLOPs over the device's peak rate for the task's math
    dtype. When that lower bound on busy time exceeds the measured wall time, the row
    cannot be this deployment at these lengths (e.g. prompts served from a prefix cache,
    shorter prompts than recorded). Disagg rows: the bound on the prefill pool."""
    demand = _prefill_demand(cfg, ttft_ms, tpot_ms)
    if demand is None:
        return None
    rate, prompt, dp, steps_per_s = demand
    system = cfg.system if isinstance(cfg.system, System) else load_system(cfg.system)
    # one device's busy time for a step of one prompt per rank
    busy_s = _graph_sum("peak_s", cfg.model, cfg.pool.plan, Batch.prefill(dp, prompt),
                        cfg.precision, system, _stack_of(cfg, system))
    needed = busy_s * steps_per_s                      # busy seconds per second
    if needed <= 1.0:
        return None
    return (f"the measured TTFT and TPOT complete {rate:.1f} requests/s (Little's law on "
            f"{cfg.concurrency} clients), whose prompts of at least {prompt} tokens need "
            f"{needed:.2f} s of matrix math per second on each device at peak rate: the "
            f"measurement contradicts the deployment it describes")


def measured_prefill_demand(cfg: ServeConfig, ttft_ms: float, tpot_ms: float,
                            providers: Sequence[CostProvider],
                            context: CostQueryContext | None
                            ) -> tuple[float, float, int, int] | None:
    """(device-seconds of prefill per second, completed requests per second, prompt
    tokens, step tokens) a row's measured throughput needs by the system's own measured
    kernels, or None (no measured providers, none of the prompt's context-free tasks
    measured, or a declared prefix-cache hit rate: the cache serves part of every
    prompt).

    The demand of `above_compute_bound` with each task priced, where the row's evidence
    measured it, by that measurement (a table's answer, measured or interpolated between
    measured points); any other task counts at the peak rate of its FLOPs, a collective
    without a measurement as free. A dense model's forward pass is one chain of kernels
    (each all-reduce needs the GEMM before it and feeds the norm after it), so its
    compute and collectives add, as the step cost model prices them; for a model with
    routed experts the time is the larger of the two, since engines can overlap the
    expert all-to-all with the other micro-batch's compute (vLLM's dual batch overlap,
    `--enable-dbo`, vLLM docs/design/dbo.md; SGLang's two-batch overlap), an opt-in
    launch flag no row records. Prompts are packed as well as the engine can: the
    context-free tasks (GEMMs, norms, collectives) are priced per token at the largest
    step the engine forms (its token budget), which the tables price at their lowest
    time per token; attention, whose work is per sequence, at the peak rate of one
    prompt's FLOPs."""
    measured = list(providers)
    demand = _prefill_demand(cfg, ttft_ms, tpot_ms)
    if demand is None or not measured or cfg.prefix_cache_hit_rate:
        return None
    rate, prompt, dp, steps_per_s = demand
    system = cfg.system if isinstance(cfg.system, System) else load_system(cfg.system)
    budget = max(prompt, int(cfg.backend.scheduler.token_budget or prompt))
    context = context or CostQueryContext(runtime=cfg.backend.name,
                                          runtime_revision=cfg.backend_version)
    key = ("measured_prefill", cfg.model.digest, cfg.pool.plan.digest, cfg.precision,
           prompt, budget, system.digest, cfg.stack,
           tuple((p.name, p.revision) for p in measured), context)
    hit = _GRAPH_SUMS.get(key)
    if hit is None:
        stack = _stack_of(cfg, system)
        compute_s, comm_s, free_measured = _measured_sum(
            cfg, Batch.prefill(dp, budget), stack, system, CostResolver(measured), context,
            context_tasks=False)
        attn_s, _, _ = _measured_sum(cfg, Batch.prefill(dp, prompt), stack, system, None,
                                     context, context_tasks=True)
        scale = prompt / budget
        compute_s, comm_s = compute_s * scale + attn_s, comm_s * scale
        busy = (max(compute_s, comm_s) if has_routed_experts(cfg.model)
                else compute_s + comm_s)
        hit = (busy, free_measured)
        if len(_GRAPH_SUMS) >= GRAPH_SUMS_MAX:
            _GRAPH_SUMS.clear()
        _GRAPH_SUMS[key] = hit
    busy_s, any_measured = hit
    return (busy_s * steps_per_s, rate, prompt, budget) if any_measured else None


def above_measured_prefill(cfg: ServeConfig, ttft_ms: float, tpot_ms: float,
                           providers: Sequence[CostProvider],
                           context: CostQueryContext | None) -> str | None:
    """Why a row's measured throughput needs more prefill time than the system's own
    measured kernels take (`measured_prefill_demand` above 1 device-second per second),
    or None."""
    demand = measured_prefill_demand(cfg, ttft_ms, tpot_ms, providers, context)
    if demand is None or demand[0] <= 1.0:
        return None
    needed, rate, prompt, budget = demand
    system = cfg.system if isinstance(cfg.system, System) else load_system(cfg.system)
    return (f"the measured TTFT and TPOT complete {rate:.1f} requests/s (Little's law on "
            f"{cfg.concurrency} clients), whose prompts of at least {prompt} tokens need "
            f"{needed:.2f} s per second on each device by {system.name}'s measured kernels "
            f"(packed into {budget}-token steps; attention at peak rate): the measurement "
            f"contradicts the deployment it describes (e.g. prompts served from a prefix "
            f"cache, or shorter than recorded)")


def _measured_sum(cfg: ServeConfig, batch: Batch, stack, system: System,
                  resolver: CostResolver | None, context: CostQueryContext,
                  *, context_tasks: bool) -> tuple[float, float, bool]:
    """(compute seconds, collective seconds, whether any task had a measurement) over the
    context tasks (`context_tasks`) or the context-free ones of `batch`'s graph
    (`step_cost.built_halves`, shared with the step cost model): each a measured or
    interpolated answer of `resolver` where it has one, else its FLOPs at the device's
    peak rate (collectives: nothing)."""
    segments = tuple((s.num_requests, s.q_tokens, s.context_tokens) for s in batch.segments)
    (free, ctx), _ = built_halves(cfg.model, cfg.pool.plan, cfg.precision, batch, segments,
                                  stack, keep_free=not context_tasks)
    compute, comm, any_measured = 0.0, 0.0, False
    for t in (ctx if context_tasks else free):
        if t.kind is TaskKind.VIEW:
            continue
        latency = None
        if resolver is not None:
            try:
                est = resolver.resolve(query_for_task(t, system.name, context)).estimate
            except UnresolvedCostError:
                est = None
            if est is not None and est.method in (EstimateMethod.MEASURED,
                                                  EstimateMethod.INTERPOLATED):
                latency, any_measured = est.latency_s, True
        if latency is None:
            latency = _peak_s(t, system) if t.kind is TaskKind.COMPUTE else 0.0
        if t.kind is TaskKind.COMMUNICATION:
            comm += latency * t.count
        else:
            compute += latency * t.count
    return compute, comm, any_measured


def _peak_s(task, system: System) -> float:
    """One call of a compute task at the device's peak rate for its engine and math
    dtype (0 when the device lists no rate for it)."""
    if task.work.flops <= 0:
        return 0.0
    engine = system.device.engines.get(str(getattr(task.work.engine, "value", task.work.engine)))
    peak = engine.peak_for(task.work.compute_dtype) if engine is not None else None
    return task.work.flops / peak if peak else 0.0
