"""Pipeline parallelism in serving: micro-batches of disjoint requests across stages.

What the engines do with `pipeline_parallel_size` (PP) > 1:

* vLLM V1 keeps a batch queue of `max_concurrent_batches` scheduled batches, which is
  PP without async scheduling ("required by pipeline parallelism to eliminate pipeline
  bubbles": `vllm/v1/engine/core.py`, `EngineCore.__init__`; `vllm/config/vllm.py`,
  `VllmConfig.max_concurrent_batches`). One scheduler and one KV cache serve them.
* vLLM V0 ran PP virtual engines: one `Scheduler` per stage, each with
  `num_gpu_blocks // pipeline_parallel_size` KV blocks and the full
  `max_num_seqs` / `max_num_batched_tokens` budget (`vllm/core/scheduler.py`,
  `Scheduler.__init__`, `_schedule_chunked_prefill`); a new request goes to the
  scheduler with the fewest unfinished sequence groups (`vllm/engine/llm_engine.py`,
  `_add_processed_request`).
* TensorRT-LLM's PyTorch executor runs `_executor_loop_pp` with
  `num_micro_batches = pp_size` micro-batch slots; scheduled requests are marked in
  flight (`_add_inflight_ids`) so the next micro-batch takes other requests
  (`tensorrt_llm/_torch/pyexecutor/py_executor.py`).
* SGLang's `event_loop_pp` keeps one running batch per micro-batch (`running_mbs`),
  each capped at `pp_max_micro_batch_size`, by default
  `max(max_running_requests // pp_size, 1)` (`python/sglang/srt/managers/
  scheduler_pp_mixin.py`, `scheduler.py`); stages send asynchronously and receive
  synchronously.

The model here: a replica with PP stages runs PP virtual engines (perfcast Engines)
of disjoint requests, each with 1/PP of the replica's KV cache and of its
running-request limit (the per-micro-batch token budget stays whole), sharing one
`StageOccupancy`. An iteration of a virtual engine that starts at `t` does its host
work (the part not hidden by an overlap scheduler), then holds stage 0 from
`max(t + host, stage 0 free)`, stage j from `max(end of stage j-1 + p2p into j,
stage j free)`, and ends when the last stage ends; its tokens come out then. Stage j
works on one micro-batch at a time, first come first served; the p2p transfer
delays the receiver without holding either stage (asynchronous sends). Stage times
are the stage split of the same costed graph the step model prices
(`StagedStepCostModel`): each task's latency goes to its `stage`, the point-to-point
pipeline transfers (`perfcast.plan.resources.P2P_OPERATIONS`) to the link into their
stage. With uniform stages and PP busy virtual engines every stage is busy and each
virtual engine keeps the serial per-token latency (throughput x PP at the same
micro-batch shape); a slower stage sets the period to PP x its time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from operator import add, sub
from typing import NamedTuple

import numpy as np

from perfcast.plan.resources import P2P_OPERATIONS
from perfcast.serving.backends import KVCacheConfig, SchedulerConfig
from perfcast.serving.engine import Engine
from perfcast.serving.step_cost import Part, StepCostModel, StepShape, costed_tasks, grid_nodes
from perfcast.workload.tensors import Task, TaskKind


@dataclass(frozen=True)
class StagedPart(Part):
    """A Part (totals over the whole graph) with its stage split in 2 x PP slots:
    slot j < PP holds the tasks of stage j but the pipeline transfers, slot PP + j the
    transfer into stage j (zero for j = 0); `slot_s` their kernel time, `slot_kernels`
    their kernel count (flat tuples: the simulator adds these a few times per
    iteration)."""

    slot_s: tuple[float, ...] = ()
    slot_kernels: tuple[float, ...] = ()

    def __add__(self, other: Part) -> StagedPart:
        if not isinstance(other, StagedPart):
            _require_zero(other)
            return self
        return StagedPart(self.kernel_s + other.kernel_s, self.kernels + other.kernels,
                          self.comm_s + other.comm_s, tuple(map(add, self.slot_s, other.slot_s)),
                          tuple(map(add, self.slot_kernels, other.slot_kernels)))

    __radd__ = __add__

    def __sub__(self, other: Part) -> StagedPart:
        if not isinstance(other, StagedPart):
            _require_zero(other)
            return self
        return StagedPart(self.kernel_s - other.kernel_s, self.kernels - other.kernels,
                          self.comm_s - other.comm_s, tuple(map(sub, self.slot_s, other.slot_s)),
                          tuple(map(sub, self.slot_kernels, other.slot_kernels)))

    def __rsub__(self, other: Part) -> StagedPart:
        return self.scaled(-1.0) + other

    def scaled(self, w: float) -> StagedPart:
        return StagedPart(self.kernel_s * w, self.kernels * w, self.comm_s * w,
                          tuple(x * w for x in self.slot_s),
                          tuple(x * w for x in self.slot_kernels))


def _require_zero(part: Part) -> None:
    """A plain Part joins a StagedPart only as the zero term (an empty LM-head term,
    an interpolation's start)."""
    if part.kernel_s or part.kernels or part.comm_s:
        raise TypeError("a Part without a stage split cannot join a StagedPart")


def stage_split(costed: Iterable[tuple[Task, float]], stages: int) -> StagedPart:
    """The stage split of costed tasks ((task, latency of one call) pairs): per stage
    the kernel time and count of its tasks, the pipeline transfers on their own."""
    slot_s = [0.0] * (2 * stages)
    slot_n = [0.0] * (2 * stages)
    comm = 0.0
    for task, latency_s in costed:
        is_comm = task.kind is TaskKind.COMMUNICATION
        slot = task.stage + (stages if is_comm and task.operation in P2P_OPERATIONS else 0)
        t = latency_s * task.count
        slot_s[slot] += t
        slot_n[slot] += task.count
        if is_comm:
            comm += t
    return StagedPart(sum(slot_s), sum(slot_n), comm, tuple(slot_s), tuple(slot_n))


class StageTimes(NamedTuple):
    """One iteration on the pipeline: host time before stage 0, each stage's GPU time,
    the p2p transfer into each stage (`link_s[0]` = 0)."""

    host_s: float
    stage_s: tuple[float, ...]
    link_s: tuple[float, ...]

    @property
    def serial_s(self) -> float:
        """The iteration's latency with the pipeline to itself."""
        return self.host_s + sum(self.stage_s) + sum(self.link_s)


class StagedStepCostModel(StepCostModel):
    """The step cost model of a PP > 1 deployment: the same costed graphs, their terms
    kept split by stage, so an iteration also has per-stage times (kernel time plus
    the launch gap of each kernel, as `gpu_s` prices the whole step)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._node_slots: dict[tuple[int, int], tuple[list[float], list[float]]] = {}

    def _part_of(self, tasks) -> StagedPart:
        return stage_split(costed_tasks(tasks, self.resolver, self.system.name, self.context),
                           self.plan.pp)

    def _slots(self, part: StagedPart, padded: int | None) -> list[float]:
        launch = self.gpu_s(_ONE_KERNEL, padded)
        return [s + n * launch for s, n in zip(part.slot_s, part.slot_kernels)]

    def stage_times(self, shape: StepShape) -> StageTimes:
        if shape.tokens <= 0:
            raise ValueError("an engine step needs at least one token")
        if shape.prefill or not self.interpolate:
            part, padded = self.kernel_parts(shape)
            slots = self._slots(part, padded)
        else:
            slots = self._decode_slots(shape.decode_requests, shape.decode_context)
        gpu = sum(slots)
        pp = self.plan.pp
        return StageTimes(float(self.with_host(gpu, shape.sequences)) - gpu,
                          tuple(slots[:pp]), tuple(slots[pp:]))

    def _decode_slots(self, requests: int, context: float) -> list[float]:
        """Slot times of a decode-only iteration, interpolated: its terms are linear in
        the context between two grid nodes, so the slots at the two nodes (kept per
        node pair) give every context in between."""
        lo, hi, w = self._bracket(max(context, 1.0))
        key = (requests, lo)
        ends = self._node_slots.get(key)
        if ends is None:
            padded = self.graph_padded(StepShape(requests, float(lo)))
            fixed = self.body(padded or -(-requests // self.dp)) + self.head(requests)
            ends = self._node_slots[key] = tuple(
                self._slots(fixed + self.attn_decode(requests, float(n)), padded) for n in (lo, hi))
        a, b = ends
        return [x + w * (y - x) for x, y in zip(a, b)] if w else list(a)

    def decode_run_times(self, requests: int, context0: float, steps: int) -> list[StageTimes]:
        """Stage times of `steps` consecutive decode-only iterations of `requests`
        requests at mean context `context0` + 0, 1, ... (vectorised over the steps:
        with interpolation the attention term is linear between grid nodes)."""
        contexts = np.maximum(context0 + np.arange(steps, dtype=float), 1.0)
        padded = self.graph_padded(StepShape(requests, context0))
        fixed = self.body(padded or -(-requests // self.dp)) + self.head(requests)

        def slots_at(context: float) -> list[float]:
            return self._slots(fixed + self.attn_decode(requests, context), padded)

        if not self.interpolate or steps <= 2:
            rows = np.array([slots_at(float(c)) for c in contexts])
        else:
            lo, hi = float(contexts[0]), float(contexts[-1])
            xs = [lo, *(n for n in grid_nodes(int(hi)) if lo < n < hi), hi]
            ys = np.array([slots_at(x) for x in xs])
            rows = np.column_stack([np.interp(contexts, xs, ys[:, i])
                                    for i in range(ys.shape[1])])
        gpu = rows.sum(axis=1)
        host = (self.with_host(gpu, requests) - gpu).tolist()
        pp = self.plan.pp
        return [StageTimes(h, tuple(r[:pp]), tuple(r[pp:])) for h, r in zip(host, rows.tolist())]


_ONE_KERNEL = Part(0.0, 1.0)


class StageOccupancy:
    """The pipeline stages of one replica, shared by its virtual engines: when each
    stage is free, and what it did."""

    def __init__(self, stages: int) -> None:
        if stages < 1:
            raise ValueError("a pipeline needs at least one stage")
        self.stages = stages
        self.free_s = [0.0] * stages
        self.busy_s = [0.0] * stages
        self.link_s = 0.0
        self.micro_batches = 0
        self.first_start_s: float | None = None
        self.last_end_s = 0.0

    def reserve(self, start_s: float, times: StageTimes) -> float:
        """Run one micro-batch that its engine starts at `start_s`; returns when it
        leaves the last stage."""
        if len(times.stage_s) != self.stages:
            raise ValueError(f"{len(times.stage_s)} stage times for {self.stages} stages")
        t = start_s + times.host_s
        for j, (dur, link) in enumerate(zip(times.stage_s, times.link_s)):
            t = max(t + link, self.free_s[j])
            if j == 0 and self.first_start_s is None:
                self.first_start_s = t
            t += dur
            self.free_s[j] = t
            self.busy_s[j] += dur
        self.link_s += sum(times.link_s)
        self.micro_batches += 1
        self.last_end_s = max(self.last_end_s, t)
        return t

    @property
    def span_s(self) -> float:
        """From the first micro-batch entering stage 0 to the last leaving the last stage."""
        return 0.0 if self.first_start_s is None else self.last_end_s - self.first_start_s

    def stage_bubble_fraction(self) -> list[float]:
        span = self.span_s
        return [1.0 - b / span if span > 0 else 0.0 for b in self.busy_s]

    def bubble_fraction(self) -> float:
        """Idle share of all stages over the span (fill, drain, stage imbalance and
        waiting for work)."""
        span = self.span_s
        return 1.0 - sum(self.busy_s) / (self.stages * span) if span > 0 else 0.0


class PipelinedCost:
    """What a virtual engine asks of the pipeline: when an iteration it starts ends."""

    def __init__(self, step, occupancy: StageOccupancy) -> None:
        """`step`: anything with `stage_times(shape)` (a StagedStepCostModel)."""
        self.step = step
        self.occupancy = occupancy

    def step_end(self, start_s: float, shape: StepShape) -> float:
        return self.occupancy.reserve(start_s, self.step.stage_times(shape))

    def decode_run(self, start_s: float, requests: int, context0: float, steps: int,
                   limit_s: float) -> list[float]:
        """Durations (start to end, stage waits included) of up to `steps` consecutive
        decode-only iterations of `requests` requests at mean context `context0` (+1
        per step), each after the previous; every one after the first starts before
        `limit_s`. While other virtual engines are busy the limit is their next
        iteration, so this is mostly one iteration; the rest of a longer run is priced
        in one vectorised call."""
        end = self.step_end(start_s, StepShape(requests, context0))
        out = [end - start_s]
        if steps > 1 and end < limit_s:
            for times in self.step.decode_run_times(requests, context0 + 1, steps - 1):
                t = end
                end = self.occupancy.reserve(t, times)
                out.append(end - t)
                if end >= limit_s:
                    break
        return out


def virtual_engines(replica: str, step: StagedStepCostModel, scheduler: SchedulerConfig,
                    kv: KVCacheConfig, kv_capacity_tokens: int, **engine_options) -> list[Engine]:
    """The `step.plan.pp` virtual engines of one replica: disjoint requests, 1/PP of
    its KV cache and of its running-request (and client in-flight) limits each, one
    shared StageOccupancy, one front-end."""
    pp = step.plan.pp
    pipe = PipelinedCost(step, StageOccupancy(pp))
    sched = replace(scheduler, max_running_requests=max(scheduler.max_running_requests // pp, 1),
                    client_in_flight=-(-scheduler.client_in_flight // pp))
    return [Engine(f"{replica}.mb{v}", step, sched, kv, kv_capacity_tokens // pp,
                   pipeline=pipe, replica=replica, **engine_options) for v in range(pp)]


def replica_kv_tokens(engines: Sequence[Engine]) -> int:
    """KV tokens of the replica the first engine belongs to (all its virtual engines)."""
    first = engines[0].replica
    return sum(e.capacity for e in engines if e.replica is first)


def pipeline_report(engines: Sequence) -> dict | None:
    """The `pipeline` section of `perfcast serve`: stages, per-stage busy time and
    bubble fractions (means over the replicas' pipelines); None without pipelining."""
    pipes: dict[int, StageOccupancy] = {}
    engines_per_pipe: dict[int, int] = {}
    for e in engines:
        p = getattr(e, "pipeline", None)
        if p is not None:
            pipes[id(p.occupancy)] = p.occupancy
            engines_per_pipe[id(p.occupancy)] = engines_per_pipe.get(id(p.occupancy), 0) + 1
    if not pipes:
        return None
    occ = list(pipes.values())
    n = len(occ)
    stages = occ[0].stages
    return {
        "stages": stages,
        "pipelines": n,
        "micro_batches_in_flight_max": max(engines_per_pipe.values()),
        "micro_batches": sum(o.micro_batches for o in occ),
        "stage_busy_s": [sum(o.busy_s[j] for o in occ) / n for j in range(stages)],
        "p2p_s": sum(o.link_s for o in occ) / n,
        "span_s": sum(o.span_s for o in occ) / n,
        "stage_bubble_fraction": [sum(o.stage_bubble_fraction()[j] for o in occ) / n
                                  for j in range(stages)],
        "bubble_fraction": sum(o.bubble_fraction() for o in occ) / n,
    }
