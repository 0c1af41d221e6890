"""Physical bounds a silicon row's measurement must respect (`perfcast validate
silicon`): a row whose TTFT and TPOT need less HBM traffic or more matrix math than its
devices allow contradicts the deployment it describes and gets a reason, not a number."""

from __future__ import annotations

from perfcast.hardware import System, load_system
from perfcast.serving.deploy import ServeConfig
from perfcast.serving.step_cost import stack_options
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


# _graph_sum's values by content (rows of one deployment at other concurrencies ask
# the same graphs); bounded, cleared when full
_GRAPH_SUMS: dict[tuple, float] = {}
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
            if t.kind is not TaskKind.COMPUTE or t.work.flops <= 0:
                continue
            engine = system.device.engines.get(str(getattr(t.work.engine, "value",
                                                           t.work.engine)))
            peak = engine.peak_for(t.work.compute_dtype) if engine is not None else None
            if peak:
                out += t.work.flops * t.count / peak
    if len(_GRAPH_SUMS) >= GRAPH_SUMS_MAX:
        _GRAPH_SUMS.clear()
    _GRAPH_SUMS[key] = out
    return out


def above_compute_bound(cfg: ServeConfig, ttft_ms: float, tpot_ms: float) -> str | None:
    """Why a row's measured throughput needs more prefill math than the devices have,
    or None.

    In a closed loop of C clients, requests complete at C / e2e per second (Little's
    law), e2e = TTFT + (osl - 1) x TPOT with the row's largest output length (the mean
    is shorter, so this undercounts the rate). Each completed request prefilled at least
    `range_ratio x isl` prompt tokens (the shortest prompt the harness samples), and a
    prefill's matrix work on a device takes at least its FLOPs over the device's peak
    rate for the task's math dtype. When that lower bound on busy time exceeds the
    measured wall time, the row cannot be this deployment at these lengths (e.g. prompts
    served from a prefix cache, shorter prompts than recorded). Disagg rows: the bound on
    the prefill pool."""
    if not cfg.concurrency or not isinstance(cfg.model, ModelSpec):
        return None
    pool = cfg.pool
    e2e_s = 1e-3 * (ttft_ms + max(cfg.osl - 1, 0) * tpot_ms)
    if e2e_s <= 0:
        return None
    rate = cfg.concurrency / e2e_s                     # requests per second, all pools
    prompt = max(1, int(cfg.range_ratio * cfg.isl))
    dp = max(1, pool.plan.dp)
    system = cfg.system if isinstance(cfg.system, System) else load_system(cfg.system)
    # one device's busy time for a step of one prompt per rank
    busy_s = _graph_sum("peak_s", cfg.model, pool.plan, Batch.prefill(dp, prompt),
                        cfg.precision, system, _stack_of(cfg, system))
    steps_per_s = rate / (dp * max(pool.workers, 1))   # such steps per second and device
    needed = busy_s * steps_per_s                      # busy seconds per second
    if needed <= 1.0:
        return None
    return (f"the measured TTFT and TPOT complete {rate:.1f} requests/s (Little's law on "
            f"{cfg.concurrency} clients), whose prompts of at least {prompt} tokens need "
            f"{needed:.2f} s of matrix math per second on each device at peak rate: the "
            f"measurement contradicts the deployment it describes")
