"""CUDA replay backend: CUDA events around each call, warm-up, optional L2 flush.

With `flush_l2`, a buffer twice the device's L2 size is overwritten before every timed
call (outside the timed region), so each call starts with a cold L2 -- the state a
kernel meets inside a real model step, where the previous kernels evicted its operands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfcast.collect.replay.base import ReplayCase, ReplayOutcome, ReplaySettings
from perfcast.collect.replay.cpu import torch_missing
from perfcast.collect.replay.torch_ops import NotReplayable, build_call
from perfcast.collect.tables import SampleStats

DEFAULT_L2_BYTES = 64 * 2**20  # used when the device does not report its L2 size


@dataclass(frozen=True)
class TimingPlan:
    """What one case's measurement does, in order (inspectable without a GPU)."""

    warmup_calls: int
    timed_calls: int
    flush_bytes: int          # 0 = no flush
    events_per_call: int = 2  # start and end event

    def steps(self) -> list[str]:
        steps = ["call"] * self.warmup_calls + ["synchronize"]
        for _ in range(self.timed_calls):
            if self.flush_bytes:
                steps.append(f"flush {self.flush_bytes} bytes")
            steps += ["record start", "call", "record end"]
        return steps + ["synchronize", "read elapsed_time"]


class CudaBackend:
    name = "cuda"

    def __init__(self, device: str = "cuda:0", *, flush_l2: bool = False) -> None:
        self.device = device
        self.flush_l2 = flush_l2

    def unavailable_reason(self) -> str:
        missing = torch_missing()
        if missing:
            return missing
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch"
        return ""

    def plan(self, settings: ReplaySettings, l2_bytes: int | None = None) -> TimingPlan:
        flush = 2 * (l2_bytes or DEFAULT_L2_BYTES) if self.flush_l2 else 0
        return TimingPlan(settings.warmup, settings.repeat_count, flush)

    def measure(self, cases: Sequence[ReplayCase], settings: ReplaySettings) -> list[ReplayOutcome]:
        import torch

        reason = self.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        props = torch.cuda.get_device_properties(torch.device(self.device))
        plan = self.plan(settings, getattr(props, "L2_cache_size", 0) or None)
        scratch = (torch.empty(plan.flush_bytes, dtype=torch.uint8, device=self.device)
                   if plan.flush_bytes else None)
        out = []
        with torch.inference_mode():
            for case in cases:
                try:
                    call = build_call(case, self.device)
                except NotReplayable as exc:
                    out.append(ReplayOutcome(case.case_id, error=str(exc)))
                    continue
                for _ in range(plan.warmup_calls):
                    call()
                torch.cuda.synchronize(self.device)
                pairs = []
                for _ in range(plan.timed_calls):
                    if scratch is not None:
                        scratch.fill_(1)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    call()
                    end.record()
                    pairs.append((start, end))
                torch.cuda.synchronize(self.device)
                samples = [s.elapsed_time(e) * 1e3 for s, e in pairs]  # ms -> us
                out.append(ReplayOutcome(case.case_id, SampleStats.of(samples)))
        return out
