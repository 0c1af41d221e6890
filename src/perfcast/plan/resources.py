"""Resources of a plan: streams (serial queues) and links (shared bandwidth).

Every pipeline stage is drawn as one representative device (its `Task.devices`
copies run the same work at the same time). A device has

* a `compute` stream for compute and view tasks;
* one communication stream per interconnect tier (`comm.nvlink`, `comm.infiniband`),
  chosen by `System.tier_for_group(participants)` unless the task names a tier
  (`work.axes["tier"]`);
* a `p2p` stream for point-to-point pipeline transfers (send/recv);
* a task may name its own stream in `attributes["stream"]` (e.g. MoE dispatch on a
  dedicated stream): special cases live in the graph's data, not in this module.

Streams run one task at a time. A link is (device, tier): transfers from different
streams that use it at the same time share its bandwidth (processor sharing of the
bandwidth part of their cost; the latency part is not shared).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from perfcast.core.errors import parse_choice
from perfcast.hardware.model import System
from perfcast.workload.tensors import Task, TaskKind

COMPUTE_STREAM = "compute"
P2P_STREAM = "p2p"
P2P_OPERATIONS = frozenset({"send_recv", "send", "recv"})


class OverlapMode(str, enum.Enum):
    """How communication may overlap compute.

    * `none`: collectives run on the compute stream (nothing overlaps on a device);
    * `comm`: collectives run on per-tier comm streams, overlapping compute only where
      the dependency graph allows it;
    * `two-microbatch`: as `comm`, and each microbatch is split into two halves whose
      compute and communication interleave (one half's all-reduce under the other's GEMMs).
    """

    NONE = "none"
    COMM = "comm"
    TWO_MICROBATCH = "two-microbatch"

    @classmethod
    def parse(cls, value: str | OverlapMode) -> OverlapMode:
        return parse_choice(cls, value, what="overlap mode", field="--overlap")

    @property
    def halves(self) -> int:
        """How many interleaved sub-microbatches each microbatch becomes."""
        return 2 if self is OverlapMode.TWO_MICROBATCH else 1


@dataclass(frozen=True)
class Placement:
    """Where one task runs: a stream of its stage's device and, for transfers, a link."""

    stream: str
    link_tier: str = ""  # "" = uses no shared link


class ResourceModel:
    """Maps tasks to streams and links for one system under one overlap mode."""

    def __init__(self, system: System | None, overlap: OverlapMode = OverlapMode.COMM) -> None:
        self.system = system
        self.overlap = overlap
        self._tier_by_group: dict[int, str] = {}

    def tier_of(self, task: Task) -> str:
        named = task.work.axes.get("tier")
        if named:
            return str(named)
        p = max(int(task.work.participants), 1)
        if p not in self._tier_by_group:
            if self.system is None or not self.system.tiers:
                self._tier_by_group[p] = "net"
            else:
                self._tier_by_group[p] = self.system.tier_for_group(p).name
        return self._tier_by_group[p]

    def place(self, task: Task) -> Placement:
        if task.kind is not TaskKind.COMMUNICATION:
            return Placement(str(task.attributes.get("stream", COMPUTE_STREAM)))
        tier = self.tier_of(task)
        if self.overlap is OverlapMode.NONE:
            return Placement(COMPUTE_STREAM, tier)
        named = task.attributes.get("stream")
        if named:
            return Placement(str(named), tier)
        if task.operation in P2P_OPERATIONS:
            return Placement(P2P_STREAM, tier)
        return Placement(f"comm.{tier}", tier)
