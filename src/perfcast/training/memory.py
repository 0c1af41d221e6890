"""Memory per device of a training step: weights, gradients, optimizer state,
activations and buffers, on the most loaded pipeline rank.

* weights: 16-bit parameters (2 bytes each; fp8 training keeps 16-bit weights and casts
  per GEMM), gradients: 16-bit (2 bytes), optimizer: fp32 master weights + Adam's two
  fp32 moments (12 bytes): 16 bytes per parameter in all (Rajbhandari et al. 2020).
  ZeRO-1 divides the optimizer state by dp x cp, ZeRO-2 also the gradients, ZeRO-3 also
  the weights (expert parameters by their own data-parallel ranks, dp x cp x tp / ep);
* activations: the bytes each chunk keeps per microbatch (`saved_activation_bytes`),
  times the microbatches live at once under the rank's pass order (1F1B: p - d on rank
  d; interleaved: more, on rank 0 most), read off the schedule's order;
* buffers: the pipeline send and receive buffers (one activation each way), ZeRO-3's
  gathered parameters of the largest layer, and the working set of the largest single
  op (its non-weight inputs and outputs) outside the saved activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.plan.training import peak_live_bytes, training_order
from perfcast.training.chunks import ChunkGraphs
from perfcast.training.graph import GRAD_BYTES, OPTIMIZER_BYTES, PARAM_BYTES
from perfcast.training.layout import TrainingLayout
from perfcast.workload.tensors import Task, TaskKind

MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "buffers")


@dataclass(frozen=True)
class DeviceMemory:
    rank: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict[str, float]:
        d = {k: getattr(self, k) for k in MEMORY_KEYS}
        d["total"] = self.total
        d["capacity"] = self.capacity
        return d

    def largest(self, n: int = 3) -> list[tuple[str, float]]:
        return sorted(((k, getattr(self, k)) for k in MEMORY_KEYS), key=lambda kv: -kv[1])[:n]

    def does_not_fit(self) -> str:
        """One line: by how much the rank is over capacity and what fills it."""
        parts = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in self.largest())
        return (f"does not fit: pipeline rank {self.rank} needs {self.total / 2**30:.1f} GiB "
                f"of {self.capacity / 2**30:.1f} GiB per device (largest: {parts})")


def _working_set(t: Task) -> float:
    if t.kind is not TaskKind.COMPUTE:
        return 0.0
    if "unfused_core" in t.attributes:
        # the unfused core's softmax output, mask and dropout output are saved activations;
        # what it adds is the scores buffer (Megatron's global memory buffer) and Q, K, V
        if t.group.endswith(".scores"):
            return sum(x.nbytes for x in t.inputs) + t.outputs[0].nbytes
        return 0.0
    ins = t.inputs[:1] if t.operation in ("gemm", "moe") else t.inputs
    return sum(x.nbytes for x in ins) + sum(x.nbytes for x in t.outputs)


def rank_memory(chunks: list[ChunkGraphs], layout: TrainingLayout, microbatches: int,
                capacity: float, p2p_message_bytes: float) -> list[DeviceMemory]:
    """Memory of every pipeline rank (index = rank)."""
    orders = training_order(layout.pp, microbatches, layout.virtual_pipeline)
    saved = [c.saved_bytes for c in chunks]
    z = layout.zero_stage
    dr, edr = layout.data_ranks, layout.expert_data_ranks
    out = []
    for d in range(layout.pp):
        mine = [c for c in chunks if c.device == d]
        dense = sum(c.params for c in mine)
        expert = sum(c.expert_params for c in mine)

        def sharded(per_param: float, from_stage: int) -> float:
            if z >= from_stage:
                return per_param * (dense / dr + expert / edr)
            return per_param * (dense + expert)

        work = max((_working_set(t) for c in mine for g in (c.forward, c.backward)
                    for t in g.tasks), default=0.0)
        buffers = work + (2 * p2p_message_bytes if layout.pp > 1 else 0.0)
        if z >= 3 and dr > 1:
            buffers += max(c.max_layer_params for c in mine) * PARAM_BYTES
        out.append(DeviceMemory(
            rank=d, weights=sharded(PARAM_BYTES, 3), gradients=sharded(GRAD_BYTES, 2),
            optimizer=sharded(OPTIMIZER_BYTES, 1),
            activations=peak_live_bytes(orders[d], saved), buffers=buffers,
            capacity=capacity))
    return out


def most_loaded(ranks: list[DeviceMemory]) -> DeviceMemory:
    return max(ranks, key=lambda r: r.total)
