"""Aggregate a StepResult into per-op rows and the JSON document of `perfcast estimate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfcast.plan.step import StepResult
from perfcast.workload.tensors import TaskKind


@dataclass(frozen=True)
class OpRow:
    lineage: str
    group: str
    operator: str
    count: int
    latency_s: float          # all calls on one device
    avg_latency_s: float      # one call
    bound: str                # compute | memory | comm | launch | none | - (evidence says not)
    share: float
    method: str               # the estimate's method
    provider: str
    flops: float              # whole step, all devices
    bytes: float              # whole step, all devices
    input_shapes: str
    match_kind: str = ""
    label: str = ""           # what the table shows as the method (partial, foreign marked)
    measured_on: str = ""     # foreign evidence: the system it was measured on


PHYSICAL_BOUNDS = ("compute", "memory", "comm", "launch", "none")


def _bound(ct) -> str:
    """What limits the op, when the answer knows it (a measured time does not say)."""
    est = ct.resolution.estimate
    if ct.task.kind is TaskKind.COMMUNICATION:
        return "comm"
    if ct.task.kind is TaskKind.VIEW:
        return "none"
    return est.bottleneck if est.bottleneck in PHYSICAL_BOUNDS else "-"


def method_label(est) -> str:
    """The method as the table shows it: a PARTIAL composite (some sub-kernels measured,
    the rest left out) is `partial`, answers from another device's evidence end in `*`."""
    label = est.method.value
    if est.statistics.get("source") == "PARTIAL" or est.uncertainty.kind == "partial":
        label = "partial"
    return label + ("*" if est.validity.get("measured_on") else "")


def uncertainty_json(u) -> dict[str, Any]:
    return {"kind": u.kind, "rel_std": u.rel_std, "low_s": u.low_s, "high_s": u.high_s,
            "sample_count": u.sample_count}


def op_rows(result: StepResult) -> list[OpRow]:
    return costed_op_rows(result.costed)


def costed_op_rows(costed) -> list[OpRow]:
    """Rows of one CostedGraph (share: of its plain sum)."""
    total = costed.sum_of_tasks_s() or 1.0  # share of the plain sum (the makespan may be less)
    rows = []
    for ct in costed.tasks:
        t = ct.task
        est = ct.resolution.estimate
        rows.append(OpRow(
            lineage=t.lineage, group=t.group, operator=t.operator, count=t.count,
            latency_s=ct.total_latency_s, avg_latency_s=ct.latency_s, bound=_bound(ct),
            share=ct.total_latency_s / total, method=est.method.value, provider=est.provider,
            flops=t.work.flops * t.count * t.devices,
            bytes=(t.work.bytes_total + t.work.message_bytes) * t.count * t.devices,
            input_shapes=";".join(",".join(map(str, s.shape)) for s in t.inputs),
            match_kind=est.match_kind.value, label=method_label(est),
            measured_on=str(est.validity.get("measured_on", ""))))
    return rows


def step_json(result: StepResult, *, include_attempts: bool = False) -> dict[str, Any]:
    g = result.graph
    mem = g.memory
    cap = result.system.device.memory.capacity_bytes
    ops = ops_json(result.costed, result.system.name, include_attempts=include_attempts)
    batch = g.batch
    return {
        "model": g.model.name,
        "model_digest": g.model.digest,
        "device": result.system.name,
        "system_digest": result.system.digest,
        "task_graph_digest": g.digest,
        "resolver": result.costed.resolver_identity,
        "parallel": {"tp": g.plan.tp, "pp": g.plan.pp, "dp": g.plan.dp, "ep": g.plan.ep,
                     "moe_tp": g.plan.moe_tp_size, "moe_dispatch": g.plan.moe_dispatch_mode,
                     "num_devices": g.num_devices},
        "batch": {"phase": batch.phase, "tokens": batch.tokens,
                  "segments": [{"num_requests": s.num_requests, "q_tokens": s.q_tokens,
                                "context_tokens": s.context_tokens} for s in batch.segments]},
        "precision": {"weight": g.precision.weight, "activation": g.precision.activation,
                      "linear_activation": g.precision.linear_activation
                      or g.precision.activation,
                      "kv_cache": g.precision.kv_cache},
        "latency_s": result.latency_s,
        "sum_of_tasks_s": result.sum_of_tasks_s,
        "plan": plan_json(result),
        "tokens_per_s_per_device": result.tokens_per_s_per_device,
        "work": {"flops": g.total_flops(), "bytes": g.total_bytes()},
        "memory_bytes": {"weights": mem.weights, "kv_cache": mem.kv_cache,
                         "activations": mem.activations, "reserve": mem.reserve,
                         "total": mem.total, "capacity": cap,
                         "fits": mem.total <= cap},
        "conventions": dict(g.conventions),
        "ops": ops,
    }


def plan_json(result: StepResult) -> dict[str, Any] | None:
    """`plan` section: makespan, plain sum, exposed comm, bubble and critical path.

    `plan.sum_of_tasks_s` sums what was scheduled (every microbatch); the top-level
    `sum_of_tasks_s` is the whole step's task latencies added up once."""
    return None if result.timeline is None else result.timeline.summary()


def tensors_json(tensors) -> list[list[Any]]:
    """`[[shape, dtype], ...]`, one pair per tensor, as `--dump-input-shapes` lists them."""
    return [[list(t.shape), t.dtype] for t in tensors]


def ops_json(costed, system_name: str, *, include_attempts: bool = False) -> list[dict[str, Any]]:
    """The `ops` list of `perfcast estimate --format json` for one CostedGraph."""
    ops = []
    for row, ct in zip(costed_op_rows(costed), costed.tasks):
        est = ct.resolution.estimate
        op: dict[str, Any] = {
            "lineage": row.lineage, "operator": row.operator, "group": row.group,
            "count": row.count, "latency_s": row.latency_s, "avg_latency_s": row.avg_latency_s,
            "method": row.method, "match_kind": row.match_kind, "provider": row.provider,
            "provider_revision": est.provider_revision, "source_revision": est.source_revision,
            "bound": row.bound, "flops": row.flops, "bytes": row.bytes,
            "confidence": est.confidence, "uncertainty": uncertainty_json(est.uncertainty),
            "validity": dict(est.validity), "raw_record_ids": list(est.raw_record_ids),
            "assumptions": list(est.assumptions),
            "inputs": tensors_json(ct.task.inputs), "outputs": tensors_json(ct.task.outputs),
        }
        formats = [t.format for t in ct.task.inputs]
        if any(f != "ND" for f in formats):
            op["input_formats"] = formats
        if row.label == "partial":
            op["partial"] = True
        if row.measured_on:
            op["foreign_evidence"] = {"measured_on": row.measured_on,
                                      "used_for": system_name}
        if est.statistics:
            op["statistics"] = dict(est.statistics)
        if include_attempts:
            op["attempts"] = [{"provider": a.provider, "outcome": a.outcome.value,
                               "reason": a.reason} for a in ct.resolution.attempts]
        ops.append(op)
    return ops
