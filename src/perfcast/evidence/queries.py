"""Derive a CostQuery from a workload Task (work facts + late-bound context)."""

from __future__ import annotations

from perfcast.evidence.contracts import CostQuery, CostQueryContext, CostSubject
from perfcast.workload.tensors import Task, TaskKind


def query_for_task(task: Task, hardware: str,
                   context: CostQueryContext | None = None) -> CostQuery:
    ctx = context or CostQueryContext()
    w = task.work
    subject = CostSubject.COMMUNICATION if task.kind is TaskKind.COMMUNICATION else CostSubject.OPERATOR
    extra = ctx.operation_dimensions.get(task.operation)
    dims = w.axes if not extra else w.axes.replace(**dict(extra))
    return CostQuery(
        subject=subject, operation=task.operation, hardware=hardware, dtype=w.compute_dtype,
        engine=w.engine.value, flops=w.flops, bytes_read=w.bytes_read,
        bytes_written=w.bytes_written, message_bytes=w.message_bytes,
        participants=w.participants, network_tier=str(w.axes.get("tier", "")), dims=dims,
        context=ctx, operator=task.operator, zero_cost=task.kind is TaskKind.VIEW,
        inputs=task.inputs, outputs=task.outputs)
