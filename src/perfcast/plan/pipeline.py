"""Pipeline-parallel schedules for inference (forward-only) and microbatch splitting.

Training's GPipe and 1F1B differ in where backward passes go. Inference has no backward
pass, so both run every stage's forward of microbatch i after microbatch i-1 on that
stage, and uniform stages give the same makespan (m + p - 1) * t and bubble fraction
(p - 1) / (m + p - 1). What still differs is how many microbatches are in flight:

* `gpipe`: stage 0 takes the next microbatch as soon as it is free; all m can be in
  flight, so activations (and per-microbatch buffers) for up to m microbatches are live;
* `1f1b`: at most p microbatches in flight (microbatch i + p enters stage 0 only after
  microbatch i has left the last stage), as an engine with p virtual engines does.
  This bounds live activations to p microbatches; with uniform stages the bound never
  delays anyone, with a slow later stage it can.
"""

from __future__ import annotations

import enum

from perfcast.core.errors import ConfigError, parse_choice
from perfcast.workload.plan_spec import Batch, BatchSegment


class PipelineSchedule(str, enum.Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"

    @classmethod
    def parse(cls, value: str | PipelineSchedule) -> PipelineSchedule:
        return parse_choice(cls, value, what="pipeline schedule", field="--pp-schedule")

    def max_in_flight(self, stages: int) -> int | None:
        """Microbatches allowed in the pipeline at once (None = unbounded)."""
        return stages if self is PipelineSchedule.ONE_F_ONE_B else None


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction of each stage for uniform stages: (p - 1) / (m + p - 1)."""
    if stages < 1 or microbatches < 1:
        raise ValueError("stages and microbatches must be positive")
    return (stages - 1) / (microbatches + stages - 1)


def split_batch(batch: Batch, parts: int, *, note: str = "") -> list[Batch]:
    """Split a step's requests into `parts` microbatches, as evenly as possible.

    Each segment's requests are dealt out separately (the first parts get one more when
    it does not divide), so a mixed step keeps its prefill/decode mix in every part.
    Requests are not cut: a single 8k-token prompt cannot become two microbatches."""
    if parts < 1:
        raise ConfigError(f"{parts} microbatches", field="--num-microbatches",
                          expected="a positive integer")
    if parts == 1:
        return [batch]
    if batch.num_requests < parts:
        raise ConfigError(
            f"the step has {batch.num_requests} request(s), too few for {parts} microbatches"
            f"{' = ' + note if note else ''} (requests are not cut)", field="--num-microbatches",
            expected=f"at most {batch.num_requests}, or more --num-queries")
    out: list[list[BatchSegment]] = [[] for _ in range(parts)]
    offset = 0
    for seg in batch.segments:
        base, extra = divmod(seg.num_requests, parts)
        for k in range(parts):
            slot = (k + offset) % parts  # rotate so remainders spread over parts
            n = base + (1 if k < extra else 0)
            if n:
                out[slot].append(BatchSegment(n, seg.q_tokens, seg.context_tokens))
        offset += extra
    batches = []
    for segs in out:
        if len(segs) == len(batch.segments) or batch.phase != "mixed":
            phase = batch.phase
        else:
            phase = "decode" if all(s.is_decode for s in segs) else "prefill"
        batches.append(Batch(tuple(segs), phase))
    return batches
