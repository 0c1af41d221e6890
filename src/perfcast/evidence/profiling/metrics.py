"""`MetricsCollector`: TensorCast coverage metrics M1-M5 of a profiling run.

Records come from a costed graph: an op answered by the profiling provider is a HIT
(PARTIAL is counted as a MISS), anything else is a MISS whose reason is the profiling
provider's attempt in the resolver trace. Each task stands for `count` invocations.

* M1 raw op-count hit rate (invocations);
* M2 fused-op hit rate: per operator name, pessimistic (any miss makes it a miss),
  with the constituents of fused groups (`FUSED_GROUPS`) collapsed into one op;
* M3 the same excluding zero-cost and accepted-miss operators;
* M4 per-shape hit rate over unique (operator, input shapes), excluding zero cost;
* M5 simulated latency coverage: analytic latency of hits / analytic latency of all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfcast.evidence.contracts import AttemptOutcome
from perfcast.evidence.profiling.empirical import PROVIDER_NAME

# Fused NPU kernels and the perfcast/TensorCast operator-name prefixes they absorb.
FUSED_GROUPS: dict[str, tuple[str, ...]] = {
    "DispatchFFNCombine": ("tensor_cast.init_routing_v2", "tensor_cast.grouped_matmul",
                           "tensor_cast.unpermute_tokens", "tensor_cast.all_to_all"),
    "MLAPO": ("tensor_cast.mlapo", "tensor_cast.mlapo_quant"),
    "MLA": ("tensor_cast.multihead_latent_attention",),
    "MC2": ("tensor_cast.matmul_all_reduce", "tensor_cast.static_quant_linear_all_reduce",
            "tensor_cast.fp8_linear_all_reduce"),
}

MISS_REASON_LABELS = {
    "unmapped": "not in op_mapping.yaml",
    "shape_mismatch": "kernel found, no matching shape in CSV",
    "input_count_mismatch": "input count differs from CSV",
    "csv_format_raw": "CSV lacks the columns of its query path",
    "csv_not_found": "kernel CSV file missing",
    "no_sub_kernels": "composite op has no sub_kernels",
    "invalid_args": "op arguments could not be read",
    "elementwise_output_shape_mismatch": "no CSV row with this output shape",
    "ep_size_not_configured": "CSV keyed by EP Size but no EP size given",
    "decompose_failed": "decomposer could not derive sub-kernels",
}

ZERO_COST_KINDS = ("zero_cost", "accepted_miss")


@dataclass(frozen=True)
class EmpiricalOpRecord:
    func_name: str
    lineage: str
    count: int
    hit: bool
    kernel_type: str            # zero_cost / accepted_miss sentinels for declared entries
    reason: str                 # "" on a hit; the miss code (or partial:<kernels>)
    tc_shapes: tuple[tuple[int, ...], ...]
    analytic_latency_s: float   # one call
    latency_s: float            # one call, as used by the estimate


def reason_code(reason: str) -> str:
    return reason.split(" (", 1)[0]


def records_from_costed(costed, provider: str = PROVIDER_NAME) -> list[EmpiricalOpRecord]:
    out = []
    for ct in costed.tasks:
        t, res = ct.task, ct.resolution
        est = res.estimate
        shapes = tuple(tuple(s.shape) for s in t.inputs if s.shape)
        if est.provider == provider:
            stats = est.statistics
            analytic = stats.get("analytic_latency_s")
            if analytic is None:
                analytic = next((a.latency_s for a in res.alternatives), est.latency_s)
            partial = stats.get("source") == "PARTIAL"
            kt = str(stats.get("kernel_type", ""))
            if stats.get("zero_cost"):
                kt = "accepted_miss" if kt == "accepted_miss" else "zero_cost"
            out.append(EmpiricalOpRecord(
                t.operator, t.lineage, t.count, not partial, kt,
                f"partial:{stats.get('missed_kernels', '')}" if partial else "",
                shapes, float(analytic), est.latency_s))
            continue
        attempt = next((a for a in res.attempts if a.provider == provider), None)
        if attempt is None:
            reason = "not_queried"
        elif attempt.outcome in (AttemptOutcome.MISS, AttemptOutcome.UNSUPPORTED):
            reason = reason_code(attempt.reason) or attempt.outcome.value
        else:
            reason = attempt.outcome.value
        out.append(EmpiricalOpRecord(t.operator, t.lineage, t.count, False, "", reason, shapes,
                                     est.latency_s, est.latency_s))
    return out


def _group_of(func: str, groups: dict[str, tuple[str, ...]]) -> str | None:
    return next((g for g, prefixes in groups.items()
                 if any(func.startswith(p) for p in prefixes)), None)


class MetricsCollector:
    def __init__(self, fused_groups: dict[str, tuple[str, ...]] | None = None) -> None:
        self.fused_groups = FUSED_GROUPS if fused_groups is None else fused_groups
        self.records: list[EmpiricalOpRecord] = []

    def collect_from_records(self, records: Iterable[EmpiricalOpRecord]) -> None:
        self.records.extend(records)

    def collect_from_costed(self, costed, provider: str = PROVIDER_NAME) -> None:
        self.collect_from_records(records_from_costed(costed, provider))

    # -- metrics -------------------------------------------------------------------
    def m1(self) -> dict[str, Any]:
        hit = sum(r.count for r in self.records if r.hit)
        total = sum(r.count for r in self.records)
        return {"m1_hit": hit, "m1_miss": total - hit, "m1_total": total,
                "m1_raw_op_count_hr": hit / total if total else 0.0}

    def m2_m3(self) -> tuple[dict[str, Any], dict[str, Any]]:
        funcs = {r.func_name for r in self.records}
        missed = {r.func_name for r in self.records if not r.hit}
        zero = {r.func_name for r in self.records if r.hit and r.kernel_type in ZERO_COST_KINDS}
        hit_funcs = funcs - missed
        groups_hit: set[str] = set()
        groups_missed: set[str] = set()
        ungrouped_hit, ungrouped_miss = set(), set()
        for f in funcs:
            g = _group_of(f, self.fused_groups)
            if g is None:
                (ungrouped_hit if f in hit_funcs else ungrouped_miss).add(f)
            else:
                (groups_hit if f in hit_funcs else groups_missed).add(g)
        groups_ok = groups_hit - groups_missed
        all_groups = groups_hit | groups_missed
        fused_hit = len(ungrouped_hit) + len(groups_ok)
        fused_total = fused_hit + len(ungrouped_miss) + len(all_groups - groups_ok)
        hit_nz = len(ungrouped_hit - zero) + len(groups_ok)
        total_nz = fused_total - len(zero & hit_funcs & ungrouped_hit)
        return ({"m2_fused_hit": fused_hit, "m2_fused_total": fused_total,
                 "m2_fused_op_hr": fused_hit / fused_total if fused_total else 0.0},
                {"m3_fused_hit_no_zc": hit_nz, "m3_fused_total_no_zc": total_nz,
                 "m3_fused_op_hr_no_zc": hit_nz / total_nz if total_nz else 0.0})

    def m4(self) -> dict[str, Any]:
        hits = {(r.func_name, r.tc_shapes) for r in self.records
                if r.hit and r.kernel_type not in ZERO_COST_KINDS}
        shapes = hits | {(r.func_name, r.tc_shapes) for r in self.records if not r.hit}
        missing = sorted(shapes - hits)
        return {"m4_hit_shapes": len(hits), "m4_total_shapes": len(shapes),
                "m4_per_shape_hr": len(hits) / len(shapes) if shapes else 0.0,
                "m4_miss_shape_list": [{"func_name": f, "shape": [list(s) for s in ss]}
                                       for f, ss in missing]}

    def m5(self) -> dict[str, Any]:
        hit = sum(r.analytic_latency_s * r.count for r in self.records if r.hit)
        total = sum(r.analytic_latency_s * r.count for r in self.records)
        return {"m5_hit_latency_sum_s": hit, "m5_total_latency_sum_s": total,
                "m5_simulated_latency_coverage": hit / total if total > 0 else 0.0}

    def miss_groups(self) -> dict[str, Any]:
        by_reason: dict[str, Counter] = {}
        for r in self.records:
            if not r.hit:
                by_reason.setdefault(r.reason, Counter())[r.func_name] += r.count
        return {reason: {"label": MISS_REASON_LABELS.get(reason.split(":")[0], reason),
                         "ops": dict(c.most_common())}
                for reason, c in sorted(by_reason.items())}

    def report(self) -> dict[str, Any]:
        m2, m3 = self.m2_m3()
        return {
            "m1": self.m1(), "m2": m2, "m3": m3, "m4": self.m4(), "m5": self.m5(),
            "misses": [{"func_name": r.func_name, "lineage": r.lineage, "reason": r.reason,
                        "count": r.count, "tc_shapes": [list(s) for s in r.tc_shapes],
                        "analytic_latency_s": r.analytic_latency_s}
                       for r in self.records if not r.hit],
            "miss_groups": self.miss_groups(),
        }

    def export_hit_miss_report(self, output_path: str | Path | None = None) -> dict[str, Any]:
        doc = self.report()
        if output_path is not None:
            p = Path(output_path)
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
            tmp.replace(p)
        return doc
