"""CPU replay backend: torch on the host, wall-clock timing of each call."""

from __future__ import annotations

import time
from collections.abc import Sequence

from perfcast.collect.replay.base import ReplayCase, ReplayOutcome, ReplaySettings
from perfcast.collect.replay.torch_ops import NotReplayable, build_call
from perfcast.collect.tables import SampleStats


def torch_missing() -> str:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (pip install 'perfcast[torch]')"
    return ""


class CpuBackend:
    """Times `repeat_count` calls after `warmup` calls with `time.perf_counter_ns`.
    `num_threads` pins torch's intra-op threads during the measurement (0 = leave torch's
    setting); the previous setting is restored afterwards."""

    name = "cpu"

    def __init__(self, num_threads: int = 0) -> None:
        self.num_threads = num_threads

    def unavailable_reason(self) -> str:
        return torch_missing()

    def measure(self, cases: Sequence[ReplayCase], settings: ReplaySettings) -> list[ReplayOutcome]:
        import torch

        previous = torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        try:
            return self._measure(cases, settings)
        finally:
            torch.set_num_threads(previous)

    def _measure(self, cases: Sequence[ReplayCase], settings: ReplaySettings) -> list[ReplayOutcome]:
        import torch

        out = []
        with torch.inference_mode():
            for case in cases:
                try:
                    call = build_call(case, "cpu")
                except NotReplayable as exc:
                    out.append(ReplayOutcome(case.case_id, error=str(exc)))
                    continue
                for _ in range(settings.warmup):
                    call()
                samples = []
                for _ in range(settings.repeat_count):
                    t0 = time.perf_counter_ns()
                    call()
                    samples.append((time.perf_counter_ns() - t0) / 1e3)
                out.append(ReplayOutcome(case.case_id, SampleStats.of(samples)))
        return out
