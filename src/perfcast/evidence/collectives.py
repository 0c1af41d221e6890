"""Analytic alpha-beta collective model over the system's interconnect tiers.

Per-device buffer `M` bytes, `p` participants, tier bandwidth `B` per direction (times
its efficiency) and latency `a`:

| operation      | ring                              | tree                                  |
|----------------|-----------------------------------|---------------------------------------|
| all_reduce     | 2(p-1)/p * M/B + 2(p-1) a         | 2 M/B + 2 ceil(log2 p) a              |
| all_gather     | (p-1)/p * M/B + (p-1) a           | (p-1)/p * M/B + ceil(log2 p) a        |
| reduce_scatter | (p-1)/p * M/B + (p-1) a           | (p-1)/p * M/B + ceil(log2 p) a        |
| all_to_all     | (p-1)/p * M/B + (p-1) a           | (same: pairwise exchange)             |
| send_recv      | M/B + a                           | M/B + a                               |

`algorithm="auto"` takes the faster of ring and tree, as NCCL's tuner does for the
sizes where each wins. The tier is the innermost one whose group capacity holds the
group (or the query's `network_tier`). This is an analytic model, not a network simulator.

On an NVIDIA system, an all_reduce whose group spans more than one scale-up domain (more
devices than the innermost tier holds, no `network_tier` named) takes NCCL's tree as it
is built across nodes: a chain through the k devices of each domain and a binary tree between the n
domains (NCCL 2.4, "double binary trees": "chains inside nodes, trees between nodes"),
so the tree's latency is 2 ((k-1) a_inner + ceil(log2 n) a_outer) instead of every hop
paying the outer tier's latency; its bandwidth term and the ring stay on the outer tier.
"""

from __future__ import annotations

import math

from perfcast.core.canonical import content_digest
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostEstimate,
    CostQuery,
    CostSubject,
    EstimateMethod,
    MatchKind,
    Miss,
    Uncertainty,
)
from perfcast.hardware.model import InterconnectTier, System

OPERATIONS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "tree", "auto")


def collective_time(operation: str, message_bytes: float, participants: int,
                    tier: InterconnectTier, algorithm: str) -> tuple[float, float, float]:
    """(total_s, bandwidth_s, latency_s) of one collective under the alpha-beta model."""
    p = participants
    bw = tier.bw_bytes_per_s * tier.efficiency
    a = tier.latency_s
    m = message_bytes
    if operation == "send_recv":
        return m / bw + a, m / bw, a
    if p <= 1:
        return 0.0, 0.0, 0.0
    steps_log = math.ceil(math.log2(p))
    if operation == "all_reduce":
        ring = (2 * (p - 1) / p * m / bw, 2 * (p - 1) * a)
        tree = (2 * m / bw, 2 * steps_log * a)
    elif operation in ("all_gather", "reduce_scatter"):
        ring = ((p - 1) / p * m / bw, (p - 1) * a)
        tree = ((p - 1) / p * m / bw, steps_log * a)
    elif operation == "all_to_all":
        ring = tree = ((p - 1) / p * m / bw, (p - 1) * a)
    else:
        raise ValueError(f"unknown collective {operation!r}")
    return _chosen(ring, tree, algorithm)


def _chosen(ring: tuple[float, float], tree: tuple[float, float],
            algorithm: str) -> tuple[float, float, float]:
    """(total_s, bandwidth_s, latency_s) of the algorithm asked for (auto: the faster)."""
    if algorithm == "ring":
        chosen = ring
    elif algorithm == "tree":
        chosen = tree
    else:
        chosen = min(ring, tree, key=sum)
    return sum(chosen), chosen[0], chosen[1]


def spanning_all_reduce(message_bytes: float, participants: int, inner: InterconnectTier,
                        outer: InterconnectTier, algorithm: str) -> tuple[float, float, float]:
    """(total_s, bandwidth_s, latency_s) of an all_reduce over `participants` devices
    filling whole `inner` domains (capacity k) joined by `outer`: the ring as
    `collective_time` on `outer`, the tree as NCCL builds it across nodes (module doc)."""
    p = participants
    domains = math.ceil(p / inner.group_capacity)
    k = math.ceil(p / domains)
    _, ring_bw, ring_lat = collective_time("all_reduce", message_bytes, p, outer, "ring")
    _, tree_bw, _ = collective_time("all_reduce", message_bytes, p, outer, "tree")
    tree_lat = 2 * ((k - 1) * inner.latency_s + math.ceil(math.log2(domains)) * outer.latency_s)
    return _chosen((ring_bw, ring_lat), (tree_bw, tree_lat), algorithm)


class CollectiveCostProvider:
    def __init__(self, system: System, *, algorithm: str = "auto") -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown collective algorithm {algorithm!r}; expected {ALGORITHMS}")
        self.system = system
        self.algorithm = algorithm
        self.name = "collective_model"
        self.revision = content_digest("perfcast.CollectiveCostProvider", {
            "system": system.digest, "algorithm": algorithm})[:23]

    def supports(self, query: CostQuery) -> bool | Miss:
        if query.subject is not CostSubject.COMMUNICATION:
            return Miss("collective model covers communication only")
        if query.operation not in OPERATIONS:
            return Miss(f"unknown collective {query.operation!r}")
        if query.hardware != self.system.name:
            return Miss(f"collective model is built for {self.system.name}")
        return True

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        p = query.participants
        if p < 1 or (query.operation == "send_recv" and p < 2):
            return Miss(f"invalid participant count {p}")
        tier = (self.system.tier_named(query.network_tier) if query.network_tier
                else self.system.tier_for_group(p))
        inner = self.system.tiers[0] if self.system.tiers else tier
        # NCCL's cross-node tree: NVIDIA systems only (other collective libraries keep
        # the one-tier model)
        spans = (query.operation == "all_reduce" and not query.network_tier
                 and self.system.device.vendor == "nvidia" and inner is not tier and inner.group_capacity is not None
                 and p > inner.group_capacity)
        if spans:
            total, bw_s, lat_s = spanning_all_reduce(query.message_bytes, p, inner, tier,
                                                     self.algorithm)
        else:
            total, bw_s, lat_s = collective_time(query.operation, query.message_bytes, p,
                                                 tier, self.algorithm)
        if total == 0:
            return CostEstimate(latency_s=0.0, method=EstimateMethod.ANALYTICAL,
                                match_kind=MatchKind.DECLARED, provider=self.name,
                                provider_revision=self.revision, bottleneck="none",
                                assumptions=("a collective over one participant moves nothing",))
        return CostEstimate(
            latency_s=total, method=EstimateMethod.ANALYTICAL, match_kind=MatchKind.MODEL,
            provider=self.name, provider_revision=self.revision,
            source_revision=self.system.digest[:23],
            validity=FrozenDict({"hardware": self.system.name, "tier": tier.name,
                                 "participants": p, "algorithm": self.algorithm}),
            uncertainty=Uncertainty(kind="model", rel_std=0.3),
            components=FrozenDict({"bandwidth_s": bw_s, "latency_s": lat_s}),
            assumptions=(f"{tier.name}: {tier.bw_bytes_per_s / 1e9:g} GB/s per direction x "
                         f"{tier.efficiency:g} efficiency, {tier.latency_s * 1e6:g} us latency",
                         *((f"spans {math.ceil(p / inner.group_capacity)} {inner.name} domains: "
                            f"tree = a chain inside each ({inner.latency_s * 1e6:g} us a hop), "
                            f"a binary tree between them",) if spans else ())),
            bottleneck="comm", confidence=0.5)
