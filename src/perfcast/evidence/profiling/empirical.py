"""`EmpiricalPerformanceModel`: the profiling data source as a `CostProvider`.

It sits first in a `CostResolver`, before the analytic providers (roofline, collective
model), so one cost path serves both:

* full HIT (MEASURED / INTERPOLATED): the empirical latency, method `measured` or
  `interpolated`; zero-cost and accepted-miss entries are declared zero;
* PARTIAL: the latency of the sub-kernels that hit plus the analytic latency (the
  fallback model) of each that missed, from the work its decomposer states (method
  `measured`, match `subset`, an assumption naming the missed kernels and their priced
  time); without a fallback model, or a missed sub-kernel with no stated work, it is a
  MISS (never a time that leaves a sub-kernel out); coverage metrics count it as a miss;
* MISS: `Miss(reason)`, so the resolver falls back and the attempts trace says why.

With a `fallback_model` (the analytic resolver) every answer also carries the analytic
latency in `statistics["analytic_latency_s"]`, the weight of the M5 coverage metric.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from perfcast.core.canonical import content_digest
from perfcast.core.errors import UnresolvedCostError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostEstimate,
    CostProvider,
    CostQuery,
    EstimateMethod,
    MatchKind,
    Miss,
    Uncertainty,
)
from perfcast.evidence.profiling.data_source import (
    DataSourcePerformanceModel,
    LookupMiss,
    QueryResult,
    QuerySource,
)
from perfcast.evidence.profiling.devices import mark_foreign
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.resolver import CostResolver

PROVIDER_NAME = "profiling"


def _shapes_text(shapes) -> str:
    return ";".join(",".join(str(d) for d in s) for s in shapes or ())


def result_statistics(result: QueryResult) -> dict:
    """What reports and traces show for an empirical answer (RFC 2.1.9)."""
    stats: dict = {"source": result.source.value, "confidence": result.confidence,
                   "kernel_type": result.kernel_type}
    info = result.shape_match_info
    if result.sub_kernel_shapes is not None:
        stats["sub_kernel_shapes"] = json.dumps([
            {"kernel_type": s.kernel_type, "simulation_shapes": _shapes_text(s.simulation_shapes),
             "kernel_shapes": _shapes_text(s.kernel_shapes), "shape_match_rule": s.shape_match_rule}
            for s in result.sub_kernel_shapes])
        stats["shape_match_rule"] = "composite"
    if info is not None:
        stats["shape_match_rule"] = info.shape_match_rule
        stats["simulation_shapes"] = _shapes_text(info.simulation_shapes)
        stats["kernel_shapes"] = _shapes_text(info.kernel_shapes)
    if "sub_kernel_durations" in result.details:
        stats["sub_kernel_durations"] = json.dumps(result.details["sub_kernel_durations"])
    if result.details.get("missed_kernels"):
        stats["missed_kernels"] = ",".join(result.details["missed_kernels"])
    if result.zero_cost:
        stats["zero_cost"] = True
    for key in ("topology_tier", "message_bytes", "num_devices", "avg_seq_len",
                "csv_avg_seq_len", "sparse_mode", "num_kv_heads", "ep_size", "dtype_scale",
                "interpolation_axis", "note", "rel_std", "loo_samples", "uncertainty_method",
                "uncertainty_reason"):
        value = result.details.get(key)
        if isinstance(value, (int, float, str, bool)) and value != "":
            stats[key] = value
    return stats


def result_uncertainty(result: QueryResult) -> Uncertainty:
    """The `Uncertainty` of a full hit from the query path's measured figures
    (`residuals`: `rel_std` None means unknown; `loo_samples` held-out rows)."""
    d = result.details
    if "rel_std" not in d:  # a path that sized nothing: say so, never invent a spread
        return Uncertainty(kind="unknown", rel_std=None)
    rel = d["rel_std"]
    return Uncertainty(kind=str(d.get("uncertainty_kind", "loo")),
                       rel_std=None if rel is None else float(rel),
                       sample_count=int(d.get("loo_samples", 0) or 0))


class EmpiricalPerformanceModel:
    """`EmpiricalPerformanceModel(device, data_source, fallback_model)` as a provider.
    `foreign_device`: the database was measured on this other device (allowed
    explicitly); every answer says so."""

    def __init__(self, device, data_source: DataSourcePerformanceModel,
                 fallback_model: CostResolver | Sequence[CostProvider] | None = None, *,
                 foreign_device: str | None = None) -> None:
        self.device = device
        self.data_source = data_source
        self.foreign_device = foreign_device
        if fallback_model is not None and not isinstance(fallback_model, CostResolver):
            fallback_model = CostResolver(list(fallback_model))
        self.fallback_model: CostResolver | None = fallback_model
        self.name = PROVIDER_NAME
        basis = {"system": device.digest, "source": data_source.identity,
                 "source_type": type(data_source).__name__}
        if foreign_device is not None:
            basis["foreign"] = foreign_device
        self.revision = content_digest("perfcast.EmpiricalPerformanceModel", basis)[:23]

    def supports(self, query: CostQuery) -> bool | Miss:
        if query.hardware != self.device.name:
            return Miss(f"profiling database is bound to {self.device.name}, not {query.hardware}")
        if not query.operator:
            return Miss("query names no operator")
        return True

    def analytic_latency_s(self, query: CostQuery) -> float | None:
        if self.fallback_model is None:
            return None
        try:
            return self.fallback_model.resolve(query).estimate.latency_s
        except UnresolvedCostError:
            return None

    def _price_missed(self, query: CostQuery, specs) -> tuple[float, str] | Miss:
        """(seconds, text) of the missed sub-kernels of a PARTIAL composite, each priced
        by the fallback model from the work its decomposer states."""
        if self.fallback_model is None:
            return Miss("partial composite: no analytic model to price the missed sub-kernels")
        total, parts = 0.0, []
        for spec in specs:
            w = spec.work
            if w is None:
                return Miss(f"partial composite: missed sub-kernel {spec.kernel_type} "
                            "states no work to price")
            sub = replace(query, operation=w.operation, engine=w.engine, flops=w.flops,
                          bytes_read=w.bytes_read, bytes_written=w.bytes_written,
                          dims=FrozenDict(dict(w.dims)), operator="", inputs=(), outputs=())
            try:
                res = self.fallback_model.resolve(sub).estimate
            except UnresolvedCostError as exc:
                return Miss(f"partial composite: {spec.kernel_type} not priced ({exc})")
            total += res.latency_s
            parts.append(f"{spec.kernel_type} {res.latency_s * 1e6:.2f} us ({res.provider})")
        return total, ", ".join(parts)

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        answer = self._estimate(query)
        if self.foreign_device is None or isinstance(answer, Miss):
            return answer
        return mark_foreign(answer, self.foreign_device, self.device.name)

    def _estimate(self, query: CostQuery) -> CostEstimate | Miss:
        outcome = self.data_source.lookup(OpInvokeInfo.from_query(query))
        if isinstance(outcome, LookupMiss):
            return Miss(str(outcome))
        stats = result_statistics(outcome)
        analytic = self.analytic_latency_s(query)
        if analytic is not None:
            stats["analytic_latency_s"] = analytic
        ids = tuple(str(i) for i in outcome.details.get("record_ids", ()))
        common = dict(provider=self.name, provider_revision=self.revision,
                      source_revision=self.data_source.identity[:23], raw_record_ids=ids,
                      confidence=outcome.confidence, statistics=FrozenDict(stats),
                      validity=FrozenDict({"hardware": self.device.name,
                                           "kernel_type": outcome.kernel_type}))
        if outcome.latency_us == 0 and outcome.zero_cost:
            note = outcome.details.get("note") or "zero_cost in op_mapping.yaml"
            return CostEstimate(latency_s=0.0, method=EstimateMethod.MEASURED,
                                match_kind=MatchKind.DECLARED, bottleneck="none",
                                assumptions=(f"declared: {note}",), **common)
        assumptions: tuple[str, ...] = ()
        latency_s = outcome.latency_us * 1e-6
        if outcome.source is QuerySource.PARTIAL:
            priced = self._price_missed(query, outcome.details.get("missed_specs", ()))
            if isinstance(priced, Miss):
                return priced
            method, match = EstimateMethod.MEASURED, MatchKind.SUBSET
            assumptions = (f"partial composite: sub-kernels without a measurement priced "
                           f"by the analytic model: {priced[1]}",)
            stats["measured_latency_s"] = latency_s
            stats["analytic_sub_kernels_s"] = priced[0]
            latency_s += priced[0]
            common["statistics"] = FrozenDict(stats)
            unc = Uncertainty(kind="partial", rel_std=None)
        else:
            if outcome.source is QuerySource.INTERPOLATED:
                method, match = EstimateMethod.INTERPOLATED, MatchKind.INTERPOLATED
            else:
                method, match = EstimateMethod.MEASURED, MatchKind.EXACT
            unc = result_uncertainty(outcome)
        return CostEstimate(latency_s=latency_s, method=method,
                            match_kind=match, uncertainty=unc, assumptions=assumptions,
                            bottleneck="measured", **common)
