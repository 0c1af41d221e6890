"""Analytic roofline provider: compute time per engine and dtype vs. memory time."""

from __future__ import annotations

from perfcast.core.canonical import content_digest
from perfcast.core.dtypes import DType, engine_dtype
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.collectives import collective_time
from perfcast.evidence.contracts import (
    CostEstimate,
    CostQuery,
    CostSubject,
    EstimateMethod,
    MatchKind,
    Miss,
    Uncertainty,
)
from perfcast.hardware.model import EngineKind, System

# When an engine lacks a dtype path, math runs on the next wider one (e.g. fp8 weights
# dequantised to bf16 on an A100). The substitution is reported as an assumption.
_WIDER: dict[str, tuple[str, ...]] = {
    "fp4": ("fp8", "bf16", "fp16"),
    "int4": ("int8", "bf16", "fp16"),
    "fp8": ("bf16", "fp16"),
    "int8": ("bf16", "fp16"),
    "bf16": ("fp16", "fp32"),
    "fp16": ("bf16", "fp32"),
    "tf32": ("fp32", "bf16"),
    "fp32": ("tf32",),
}

MODES = ("roofline", "no_overlap")
ANALYTIC_REL_STD = 0.3  # typical spread of roofline vs. measured kernels (20-60% off)


class RooflineCostProvider:
    """Latency = max(compute, memory) (`roofline`) or their sum (`no_overlap`), plus the
    device's launch overhead (once per kernel: `kernel_launches` of a fused call, else
    one). `use_efficiency=False` uses bare peaks.

    compute = flops / (peak[engine][dtype] * efficiency[engine])
    memory  = (bytes_read + bytes_written) / (bandwidth * efficiency.memory)
    """

    def __init__(self, system: System, *, mode: str = "roofline", use_efficiency: bool = True,
                 include_launch: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown roofline mode {mode!r}; expected one of {MODES}")
        self.system = system
        self.mode = mode
        self.use_efficiency = use_efficiency
        self.include_launch = include_launch
        self.name = "roofline"
        self.revision = content_digest("perfcast.RooflineCostProvider", {
            "system": system.digest, "mode": mode, "efficiency": use_efficiency,
            "launch": include_launch})[:23]

    def supports(self, query: CostQuery) -> bool | Miss:
        if query.subject is not CostSubject.OPERATOR:
            return Miss("roofline covers operators, not communication")
        if query.hardware != self.system.name:
            return Miss(f"roofline is built for {self.system.name}, not {query.hardware}")
        return True

    def _rate(self, engine: str, dtype: str) -> tuple[float, str, tuple[str, ...]]:
        dev = self.system.device
        kind = EngineKind.MATRIX if engine == "matrix" else EngineKind.VECTOR
        eng = dev.engine(kind)
        key = engine_dtype(dtype).value
        eff = self.system.efficiency.for_engine(kind) if self.use_efficiency else 1.0
        rate = eng.peak_ops_per_s.get(key)
        assumptions: tuple[str, ...] = ()
        used = key
        if rate is None:
            for alt in _WIDER.get(key, ()):
                if alt in eng.peak_ops_per_s:
                    rate, used = eng.peak_ops_per_s[alt], alt
                    assumptions = (f"{dev.name} {kind.value} engine has no {key} rate; "
                                   f"costed at its {alt} rate",)
                    break
        if rate is None and kind is EngineKind.VECTOR:
            rate, used = eng.peak_ops_per_s["fp32"], "fp32"
            assumptions = (f"{dev.name} vector engine lists no {key} rate; costed at fp32",)
        if rate is None:
            raise LookupError(f"{dev.name} {kind.value} engine has no rate for {key}")
        return rate * eff, used, assumptions

    def _fused_collectives_s(self, query: CostQuery) -> float:
        """Alpha-beta time of the collectives a fused kernel runs (axis
        `comm_collectives`: `operation:message_bytes` joined by `+`), over the tier of
        the query's group."""
        spec = query.dim("comm_collectives")
        if not spec:
            return 0.0
        p = int(query.participants or query.dim("participants", 0) or 0)
        tier = (self.system.tier_named(query.network_tier) if query.network_tier
                else self.system.tier_for_group(p))
        total = 0.0
        for part in str(spec).split("+"):
            operation, message = part.split(":")
            total += collective_time(operation, float(message), p, tier, "auto")[0]
        return total

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        if query.zero_cost:
            return CostEstimate(latency_s=0.0, method=EstimateMethod.ANALYTICAL,
                                match_kind=MatchKind.DECLARED, provider=self.name,
                                provider_revision=self.revision, bottleneck="none",
                                assumptions=("declared zero-cost view op",))
        dev = self.system.device
        mem_eff = self.system.efficiency.memory if self.use_efficiency else 1.0
        compute_s = 0.0
        assumptions: tuple[str, ...] = ()
        rate_key = ""
        if query.flops > 0:
            try:
                rate, rate_key, assumptions = self._rate(query.engine, query.dtype)
            except LookupError as exc:
                return Miss(str(exc))
            compute_s = query.flops / rate
        memory_s = query.bytes_total / (dev.memory.bw_bytes_per_s * mem_eff)
        if compute_s == 0 and memory_s == 0:
            return Miss("query has neither FLOPs nor bytes and is not declared zero-cost")
        core = max(compute_s, memory_s) if self.mode == "roofline" else compute_s + memory_s
        comm_s = self._fused_collectives_s(query)
        if comm_s:  # a fused compute + communication kernel (MC2, DispatchFFNCombine)
            core = max(core, comm_s) if query.dim("comm_combine") == "overlap" else core + comm_s
        # a fused call that runs as several kernels (`kernel_launches`) launches each
        launches = int(query.dim("kernel_launches", 1) or 1)
        launch_s = dev.launch_overhead_s * launches if self.include_launch else 0.0
        latency = core + launch_s
        bottleneck = "compute" if compute_s >= memory_s else "memory"
        intensity = query.flops / query.bytes_total if query.bytes_total else float("inf")
        validity = {"hardware": self.system.name, "engine": query.engine,
                    "dtype": DType(query.dtype).value if query.dtype else ""}
        if rate_key:
            validity["rate_dtype"] = rate_key
        components = {"compute_s": compute_s, "memory_s": memory_s, "launch_s": launch_s}
        if comm_s:
            components["comm_s"] = comm_s
        if intensity != float("inf"):
            components["arithmetic_intensity"] = intensity
        return CostEstimate(
            latency_s=latency, method=EstimateMethod.ANALYTICAL, match_kind=MatchKind.MODEL,
            provider=self.name, provider_revision=self.revision,
            source_revision=self.system.digest[:23],
            validity=FrozenDict(validity),
            uncertainty=Uncertainty(kind="model", rel_std=ANALYTIC_REL_STD),
            components=FrozenDict(components), assumptions=assumptions,
            bottleneck=bottleneck, confidence=0.5)
