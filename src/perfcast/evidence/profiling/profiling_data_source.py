"""`ProfilingDataSource`: a read-only adapter over a TensorCast profiling database
(`op_mapping.yaml` + `{kernel_type}.csv`), dispatching each operator to its query path.

Dispatch is driven by the mapping entry, in this order: composite, communication,
attention special, elementwise, MoE fused, zero cost, accepted miss, compute.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from perfcast.core.canonical import content_digest
from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import (
    DataSourcePerformanceModel,
    LookupMiss,
    LookupOutcome,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
)
from perfcast.evidence.profiling.decomposers import COMPOSITE_DECOMPOSERS, Decomposer
from perfcast.evidence.profiling.kernel_csv import KernelTables
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import MAPPING_FILE, OpMapping, load_op_mapping
from perfcast.evidence.profiling.query_paths.attention import lookup_attention
from perfcast.evidence.profiling.query_paths.communication import lookup_communication
from perfcast.evidence.profiling.query_paths.composite import (
    lookup_decomposed,
    lookup_static_composite,
)
from perfcast.evidence.profiling.query_paths.compute import lookup_compute
from perfcast.evidence.profiling.query_paths.elementwise import lookup_elementwise
from perfcast.evidence.profiling.query_paths.moe import lookup_moe

QUERY_MODE_PATHS = {
    "attention_special": lookup_attention,
    "elementwise": lookup_elementwise,
    "moe_fused": lookup_moe,
}


class ProfilingDataSource(DataSourcePerformanceModel):
    """`ProfilingDataSource(data_dir, device, parallel_config)`.

    * `device`: a `System`; its `comm_grid` resolves `topology_tier` for communication
      rows (without one, rows are not filtered by tier);
    * `parallel_config`: a `ParallelPlan`; its `ep` is the EP size of MoE-fused rows
      (without one, CSVs keyed by `EP Size` miss with `ep_size_not_configured`), its
      `sp` selects the sequence-parallel comm variant of MC2 composites;
    * `decomposers`: overrides/extends `COMPOSITE_DECOMPOSERS`;
    * `lookup_device`: the device whose rows answer (default: `device`'s name, else the
      mapping's `device`); rows replayed on another device are not used.
    """

    def __init__(self, data_dir: str | Path, device=None, parallel_config=None, *,
                 decomposers: Mapping[str, Decomposer] | None = None,
                 lookup_device: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        if not self.data_dir.is_dir():
            raise ConfigError("is not a directory", source=str(self.data_dir),
                              field="--profiling-database",
                              expected=f"a directory holding {MAPPING_FILE} and kernel CSVs")
        self.mapping: OpMapping = load_op_mapping(self.data_dir)
        comm_dir = ((self.data_dir / self.mapping.communication_data_ref).resolve()
                    if self.mapping.communication_data_ref else None)
        self.device = device
        # lookups for this device never use rows replayed on another (default: the
        # system's; with foreign evidence allowed, the database's own)
        self.lookup_device = lookup_device if lookup_device is not None else \
            getattr(device, "name", "") or self.mapping.device
        self.tables = KernelTables(self.data_dir, comm_dir, self.lookup_device)
        self.comm_grid = getattr(device, "comm_grid", None)
        self.ep_size: int | None = parallel_config.ep if parallel_config is not None else None
        self.tp_size: int | None = parallel_config.tp if parallel_config is not None else None
        # MC2 composites use their `runtime_comm_variants.sequence_parallel` collective
        self.sequence_parallel = bool(getattr(parallel_config, "sp", False))
        self.decomposers: dict[str, Decomposer] = {**COMPOSITE_DECOMPOSERS, **(decomposers or {})}
        self._identity = ""

    # -- LookupContext -------------------------------------------------------------
    def topology_tier(self, participants: int, tier_name: str = "") -> int | None:
        if self.comm_grid is None:
            return None
        if tier_name:
            key = self.comm_grid.tier_key(tier_name)
            if key is not None:
                return key
        try:
            return self.comm_grid.tier_for_contiguous(participants)
        except ValueError:
            return None

    def decomposer_for(self, operator: str) -> Decomposer | None:
        return self.decomposers.get(operator)

    # -- identity ------------------------------------------------------------------
    @property
    def identity(self) -> str:
        """Digest of the mapping file, every CSV in the database (and the comm dir),
        the rank grid and the EP size: what every answer depends on."""
        if not self._identity:
            files = {}
            dirs = [self.data_dir] + ([self.tables.comm_dir] if self.tables.comm_dir else [])
            for d in dirs:
                if d.is_dir():
                    for p in sorted(d.glob("*.csv")) + sorted(d.glob("*.yaml")):
                        files[str(p.relative_to(d.parent))] = hashlib.sha256(
                            p.read_bytes()).hexdigest()
            grid = None
            if self.comm_grid is not None:
                grid = {"shape": list(self.comm_grid.shape),
                        "tiers": {str(k): v for k, v in self.comm_grid.tiers.items()}}
            self._identity = content_digest("perfcast.ProfilingDataSource", {
                "files": files, "comm_grid": grid, "ep_size": self.ep_size,
                **({"sequence_parallel": True} if self.sequence_parallel else {}),
                "device": self.lookup_device,
                "decomposers": sorted(self.decomposers)})
        return self._identity

    # -- lookup --------------------------------------------------------------------
    def lookup(self, op: OpInvokeInfo) -> LookupOutcome:
        m = self.mapping.get(op.func)
        sim = tuple(tuple(t.shape) for t in op.tensor_inputs())
        if m is None:
            return LookupMiss("unmapped", f"{op.func} is not in {MAPPING_FILE}",
                              ShapeMatchInfo(sim, (), "unmapped"))
        if m.composite:
            decomposer = self.decomposer_for(op.func)
            if decomposer is not None:
                return lookup_decomposed(self, op, m, decomposer)
            return lookup_static_composite(self, op, m)
        if m.category == "communication":
            return lookup_communication(self, op, m)
        path = QUERY_MODE_PATHS.get(m.query_mode)
        if path is not None:
            return path(self, op, m)
        if m.zero_cost:
            return QueryResult(0.0, 1.0, QuerySource.MEASURED,
                               {"kernel_type": m.kernel_type, "zero_cost": True},
                               ShapeMatchInfo(sim, (), "zero_cost"))
        if m.accepted_miss:
            return QueryResult(0.0, 1.0, QuerySource.MEASURED,
                               {"kernel_type": "accepted_miss", "zero_cost": True,
                                "note": m.accepted_miss},
                               ShapeMatchInfo(sim, (), "accepted_miss"))
        return lookup_compute(self, op, m)
