"""Training pipeline schedules (1F1B and interleaved 1F1B) on the plan layer's scheduler.

Each pipeline rank runs a list of forward (F) and backward (B) passes of model chunks
over microbatches in the order Megatron-LM's schedules issue them:

* 1F1B (`virtual == 1`, Narayanan et al. 2021 section 2.2): rank d runs p - d - 1 warm-up
  forwards, then alternates one forward and one backward, then drains the backwards;
* interleaved 1F1B (`virtual = v > 1`): rank d holds chunks d, d + p, ..., and runs
  (p - d - 1) x 2 + (v - 1) x p warm-up forward chunk-passes; pass k of a rank is chunk
  (k // p) mod v of microbatch (k // (p v)) p + k mod p (backwards visit chunks in
  reverse). Needs m divisible by p. With uniform chunks and free communication the
  bubble is (p - 1) / v chunk-pass pairs: bubble fraction (p - 1) / (m v) of the ideal time.

Every pass is one instance on its rank's `compute` stream (its duration comes from
scheduling the chunk's task graph with `schedule_plan`); activations and gradients move
between chunks as instances on the receiving rank's `p2p` stream; a pass may carry a DP
gradient-communication tail on the rank's `comm.dp` stream (the part of its bucketed
gradient reduction that outlasts its compute); the optimizer step follows the last pass
and the rank's gradient communication, and a parameter all-gather may follow it (ZeRO).
The order is enforced by chaining each rank's passes; the discrete-event scheduler
(`perfcast.plan.scheduler.simulate`) does the rest, so the bubble is what the schedule
leaves idle, not a formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from perfcast.core.errors import ConfigError
from perfcast.plan.scheduler import Problem, Schedule, simulate


@dataclass(frozen=True)
class PipelineOp:
    kind: str        # "F" | "B"
    microbatch: int
    chunk: int       # global virtual stage: local chunk x p + rank

    @property
    def label(self) -> str:
        return f"{self.kind}{self.microbatch}.c{self.chunk}"


@lru_cache(maxsize=64)
def training_order(pp: int, microbatches: int, virtual: int = 1
                   ) -> tuple[tuple[PipelineOp, ...], ...]:
    """Per pipeline rank, its passes in issue order (see the module docstring)."""
    p, m, v = pp, microbatches, virtual
    if p < 1 or m < 1 or v < 1:
        raise ConfigError("pipeline ranks, microbatches and virtual stages must be positive",
                          field="--pp-size", expected="positive integers")
    if v > 1 and m % p:
        raise ConfigError(f"the interleaved schedule needs microbatches ({m}) divisible by "
                          f"pp ({p})", field="--global-batch-size",
                          expected=f"a multiple of micro-batch x dp x {p}")
    orders = []
    total = m * v
    for d in range(p):
        if v == 1:
            warm = min(p - d - 1, m)
        else:
            warm = min((p - d - 1) * 2 + (v - 1) * p, total)

        def fwd(k: int) -> PipelineOp:
            local = (k % (p * v)) // p
            return PipelineOp("F", (k // (p * v)) * p + k % p, local * p + d)

        def bwd(k: int) -> PipelineOp:
            local = v - 1 - (k % (p * v)) // p
            return PipelineOp("B", (k // (p * v)) * p + k % p, local * p + d)

        ops = [fwd(k) for k in range(warm)]
        for i in range(total - warm):
            ops.append(fwd(warm + i))
            ops.append(bwd(i))
        ops.extend(bwd(k) for k in range(total - warm, total))
        orders.append(tuple(ops))
    return tuple(orders)


@dataclass(frozen=True)
class PassCosts:
    """Durations the pipeline schedules, per chunk (global virtual stage) unless noted.

    `dp_tail_s[c]`: gradient communication of chunk c that outlasts its last backward
    pass (or every backward pass with `dp_every_microbatch`, ZeRO-2/3); `dp_after_s[d]`:
    rank d's gradient communication when it is not overlapped (after its last pass);
    `p2p_s`: one activation (or gradient) transfer between consecutive chunks."""

    forward_s: Sequence[float]
    backward_s: Sequence[float]
    p2p_s: float = 0.0
    dp_tail_s: Sequence[float] = ()
    dp_every_microbatch: bool = False
    dp_after_s: Sequence[float] = ()
    optimizer_s: Sequence[float] = ()   # per rank
    param_gather_s: Sequence[float] = ()  # per rank, after the optimizer (ZeRO)
    # ZeRO-1/2 with the parameter all-gather overlapped with the forward, per chunk: the
    # all-gather of its first bucket, issued at the step's start on the rank's `comm.dp`
    # stream (in local chunk order), which the chunk's first forward pass (microbatch 0)
    # waits for; and how much longer that pass takes waiting for its later buckets
    param_gather_first_s: Sequence[float] = ()
    first_forward_extra_s: Sequence[float] = ()


@dataclass(frozen=True)
class TrainingSchedule:
    """The scheduled step. Instances: `labels[i]` on rank `rank[i]`, stream `stream[i]`."""

    pp: int
    microbatches: int
    virtual: int
    labels: tuple[str, ...]
    rank: tuple[int, ...]
    stream: tuple[str, ...]
    kind: tuple[str, ...]          # F | B | p2p | dp | optimizer | param_gather
    schedule: Schedule
    last_pass_end_s: tuple[float, ...]   # per rank: end of its last compute pass
    pass_busy_s: tuple[float, ...]       # per rank: sum of its pass durations
    end_s: tuple[float, ...]             # per rank: end of its last instance
    # per rank: idle time of its compute stream waiting for the first parameter buckets
    # (the part of the step-start all-gathers not hidden by the pipeline fill)
    param_gather_wait_s: tuple[float, ...] = ()
    # compressed: the instances are those of `scheduled_microbatches`; makespan and the
    # per-rank times above are extrapolated linearly to `microbatches` (0: all scheduled)
    scheduled_microbatches: int = 0

    @property
    def makespan_s(self) -> float:
        return max(self.end_s)

    def rank_end_s(self, d: int) -> float:
        return self.end_s[d]

    def critical_path_labels(self) -> list[str]:
        return [f"{self.labels[i]}@rank{self.rank[i]}" for i in self.schedule.critical_path()]

    def bubble_s(self, d: int) -> float:
        """Idle time of rank d's compute stream before its last pass ends."""
        return max(self.last_pass_end_s[d] - self.pass_busy_s[d], 0.0)


# Compressed scheduling: with m >= COMPRESS_FACTOR x p microbatches, the step is scheduled
# with 3p and 4p microbatches and extrapolated linearly in m. Past the warm-up (at most
# 2p - 1 + (v - 1) p passes per rank) and the settling of the steady state, every further p
# microbatches add the same period, so the extrapolation is exact for passes of fixed
# durations (tested against the full schedule; 2p and 3p were not enough for chunks of
# random durations).
COMPRESS_FACTOR = 6
COMPRESS_POINTS = (3, 4)


def schedule_training(pp: int, microbatches: int, virtual: int, costs: PassCosts, *,
                      full: bool = False) -> TrainingSchedule:
    """Schedule one training step of `pp` ranks (see the module docstring). Unless `full`,
    long steps are scheduled compressed (COMPRESS_FACTOR)."""
    m = microbatches
    if full or m < COMPRESS_FACTOR * pp:
        return _schedule(pp, m, virtual, costs)
    m_a, m_b = COMPRESS_POINTS[0] * pp, COMPRESS_POINTS[1] * pp
    a = _schedule(pp, m_a, virtual, costs)
    b = _schedule(pp, m_b, virtual, costs)
    k = (m - m_a) / (m_b - m_a)

    def grow(xa, xb):
        return tuple(x + k * (y - x) for x, y in zip(xa, xb))

    return replace(b, microbatches=m, last_pass_end_s=grow(a.last_pass_end_s, b.last_pass_end_s),
                   pass_busy_s=grow(a.pass_busy_s, b.pass_busy_s), end_s=grow(a.end_s, b.end_s),
                   scheduled_microbatches=m_b)


def _schedule(pp: int, microbatches: int, virtual: int, costs: PassCosts) -> TrainingSchedule:
    orders = training_order(pp, microbatches, virtual)
    chunks = pp * virtual
    if len(costs.forward_s) != chunks or len(costs.backward_s) != chunks:
        raise ConfigError(f"got {len(costs.forward_s)} forward and {len(costs.backward_s)} "
                          f"backward durations for {chunks} chunks", field="costs")
    prob = Problem()
    labels: list[str] = []
    rank: list[int] = []
    stream_name: list[str] = []
    kinds: list[str] = []
    streams: dict[tuple[int, str], int] = {}

    def add(label: str, d: int, name: str, kind: str, duration: float, prio: int) -> int:
        sid = streams.setdefault((d, name), len(streams))
        labels.append(label)
        rank.append(d)
        stream_name.append(name)
        kinds.append(kind)
        return prob.add(max(duration, 0.0), sid, priority=prio)

    op_id: dict[tuple[str, int, int], int] = {}
    last_b: dict[int, tuple[int, int]] = {}  # chunk -> (position, microbatch) of its last B
    first_gather: dict[int, int] = {}  # chunk -> its first bucket's all-gather instance
    if costs.param_gather_first_s:
        for d in range(pp):
            for c in range(d, chunks, pp):
                if costs.param_gather_first_s[c] > 0:
                    j = add(f"dp.param_all_gather.c{c}", d, "comm.dp", "param_gather",
                            costs.param_gather_first_s[c], -1)
                    if c - pp in first_gather:
                        prob.preds[j].append(first_gather[c - pp])
                    first_gather[c] = j
    for d, ops in enumerate(orders):
        for pos, op in enumerate(ops):
            dur = costs.forward_s[op.chunk] if op.kind == "F" else costs.backward_s[op.chunk]
            if op.kind == "F" and op.microbatch == 0 and costs.first_forward_extra_s:
                dur += costs.first_forward_extra_s[op.chunk]
            op_id[(op.kind, op.microbatch, op.chunk)] = add(op.label, d, "compute", op.kind,
                                                            dur, pos)
            if op.kind == "F" and op.microbatch == 0 and op.chunk in first_gather:
                prob.preds[op_id[(op.kind, op.microbatch, op.chunk)]].append(
                    first_gather[op.chunk])
            if op.kind == "B":
                last_b[op.chunk] = (pos, op.microbatch)
    tails: dict[int, list[int]] = {d: [] for d in range(pp)}
    for d, ops in enumerate(orders):
        prev = -1
        for pos, op in enumerate(ops):
            i = op_id[(op.kind, op.microbatch, op.chunk)]
            if prev >= 0:
                prob.preds[i].append(prev)
            prev = i
            if op.kind == "F" and op.chunk > 0:
                src = op_id[("F", op.microbatch, op.chunk - 1)]
                j = add(f"p2p.F{op.microbatch}.c{op.chunk}", d, "p2p", "p2p", costs.p2p_s,
                        pos)
                prob.preds[j].append(src)
                prob.preds[i].append(j)
            if op.kind == "B":
                if op.chunk < chunks - 1:
                    src = op_id[("B", op.microbatch, op.chunk + 1)]
                    j = add(f"p2p.B{op.microbatch}.c{op.chunk}", d, "p2p", "p2p",
                            costs.p2p_s, pos)
                    prob.preds[j].append(src)
                    prob.preds[i].append(j)
                is_last = last_b[op.chunk][1] == op.microbatch
                tail = costs.dp_tail_s[op.chunk] if costs.dp_tail_s else 0.0
                if tail > 0 and (is_last or costs.dp_every_microbatch):
                    j = add(f"dp.B{op.microbatch}.c{op.chunk}", d, "comm.dp", "dp", tail, pos)
                    prob.preds[j].append(i)
                    tails[d].append(j)
        last = prev
        after = [last, *tails[d]]
        if costs.dp_after_s and costs.dp_after_s[d] > 0:
            j = add("dp.gradients", d, "comm.dp", "dp", costs.dp_after_s[d], len(ops))
            prob.preds[j].append(last)
            after = [j, *tails[d]]
        opt = costs.optimizer_s[d] if costs.optimizer_s else 0.0
        j = add("optimizer", d, "compute", "optimizer", opt, len(ops) + 1)
        prob.preds[j].extend(after)
        if costs.param_gather_s and costs.param_gather_s[d] > 0:
            k = add("dp.param_all_gather", d, "comm.dp", "param_gather",
                    costs.param_gather_s[d], len(ops) + 2)
            prob.preds[k].append(j)
    sched = simulate(prob)
    last_end, busy = [], []
    for d, ops in enumerate(orders):
        ids = [op_id[(op.kind, op.microbatch, op.chunk)] for op in ops]
        last_end.append(sched.end_s[ids[-1]])
        busy.append(sum(prob.duration_s[i] for i in ids))
    waits = []
    for d in range(pp):
        w = 0.0
        for c in range(d, chunks, pp):
            if c not in first_gather:
                continue
            i = op_id[("F", 0, c)]
            others = [sched.end_s[x] for x in prob.preds[i] if x != first_gather[c]]
            w += max(0.0, sched.end_s[first_gather[c]] - max(others, default=0.0))
        waits.append(w)
    ends = [0.0] * pp
    for e, r in zip(sched.end_s, rank):
        if e > ends[r]:
            ends[r] = e
    return TrainingSchedule(pp=pp, microbatches=microbatches, virtual=virtual,
                            labels=tuple(labels), rank=tuple(rank), stream=tuple(stream_name),
                            kind=tuple(kinds), schedule=sched, last_pass_end_s=tuple(last_end),
                            pass_busy_s=tuple(busy), end_s=tuple(ends),
                            param_gather_wait_s=tuple(waits))


def peak_live_bytes(ops: Sequence[PipelineOp], bytes_per_chunk: Sequence[float]) -> float:
    """Most activation bytes a rank holds at once under its pass order: a forward pass
    of chunk c adds `bytes_per_chunk[c]` until the matching backward pass frees it."""
    live = peak = 0.0
    for op in ops:
        live += bytes_per_chunk[op.chunk] if op.kind == "F" else -bytes_per_chunk[op.chunk]
        peak = max(peak, live)
    return peak
