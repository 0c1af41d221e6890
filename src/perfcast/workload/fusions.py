"""Fusion passes of a software stack, applied to a built task list.

A stack profile lists the fusions its engine runs (`stacks.yaml`, `fusions:`); each
is a `FusionPattern` here: a run of consecutive tasks whose operators match the pattern's
parts, in order, each feeding the next, is replaced by one task calling the fused
operator, as TensorCast's fusion passes rewrite its `--compile` graph (Ascend/msmodeling
84fec85, `tensor_cast/compilation/freezing_passes/`).

The fused task:

* calls the operator the pattern names for the variant of its key part (quantised
  linears and grouped GEMMs have their own fused operators), with the inputs of the
  pattern's `inputs_from` part and the outputs of the last part;
* does the work of its parts: FLOPs are their sum; bytes are their sum minus the
  intermediate tensors between two compute parts (written by one, read back by the
  next), which the fused kernel keeps on chip; the communication buffers handed to or
  taken from a collective stay counted; `message_bytes` is the sum of the collectives'
  messages, `participants` their group size (axes `message_bytes`, `participants` and
  `tier` say the same to lookups);
* holds the parts' weights (`weight_params`, `weight_bytes`, `active_weight_params`
  summed; every weight-holding part must have the same `weight_shards`), so parameter
  counts and memory facts are those of the unfused graph.

The analytic roofline prices a fused task's collectives (axis `comm_collectives`: each
`operation:message_bytes`) with the collective model and adds them as TensorCast's
estimator of the fused operator does (`comm_combine`: MC2 overlaps them with the matmul,
DispatchFFNCombine runs them after the compute); a profiling database's composite row
(MC2: matmul + `hcom_allReduce_`) or the fused kernel's own row (DispatchFFNCombine)
measures the whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.workload.tensors import Task, TaskKind, Work

# attributes summed over the parts (weights held by the fused kernel)
SUMMED_ATTRIBUTES = ("weight_params", "weight_bytes", "active_weight_params", "bias_params")


@dataclass(frozen=True)
class FusionPattern:
    """`parts`: the operators each consecutive task may call, in order; `fused`: the
    fused operator by the operator of part `key_part`; `operation`: the fused task's
    operation (empty: the key part's); `group`: its group (empty: the key part's)."""

    name: str
    parts: tuple[frozenset[str], ...]
    key_part: int
    fused: dict[str, str]
    inputs_from: int = 0
    operation: str = ""
    group: str = ""
    source: str = ""
    # how the fused kernel's collectives add to its compute: `overlap` (max of the two)
    # or `serial` (after it), as TensorCast's estimator of the fused operator prices it
    comm_combine: str = "serial"
    # parts the compiled graph may lack (TensorCast's regroup copy when every local expert
    # receives rows); the pattern also matches without them
    optional_parts: frozenset[int] = frozenset()
    # parts whose weight lists (inputs from their `weight_list_from` attribute on) the
    # fused call receives after the `inputs_from` part's inputs, as list arguments
    weights_from: tuple[int, ...] = ()

    def variants(self) -> tuple[FusionPattern, ...]:
        """The pattern, then (if it has optional parts) the pattern without them."""
        if not self.optional_parts:
            return (self,)
        keep = [k for k in range(len(self.parts)) if k not in self.optional_parts]
        shorter = replace(self, parts=tuple(self.parts[k] for k in keep),
                          key_part=keep.index(self.key_part),
                          inputs_from=keep.index(self.inputs_from),
                          weights_from=tuple(keep.index(k) for k in self.weights_from),
                          optional_parts=frozenset())
        return (self, shorter)


def _ops(*names: str) -> frozenset[str]:
    return frozenset(names)


# TensorCast's linear -> linear + all-reduce rewrites
# (tensor_cast/compilation/freezing_passes/patterns/matmul_allreduce.py: the linear's
# output has one user, the all_reduce; the fused call takes the linear's arguments)
_MC2_LINEARS = {
    "aten.mm.default": "tensor_cast.matmul_all_reduce.default",
    "tensor_cast.static_quant_linear.default": "tensor_cast.static_quant_linear_all_reduce.default",
    "tensor_cast.static_quant_linear_int4.default":
        "tensor_cast.static_quant_linear_int4_all_reduce.default",
    "tensor_cast.fp8_linear.default": "tensor_cast.fp8_linear_all_reduce.default",
    "tensor_cast.mxfp4_linear.default": "tensor_cast.mxfp4_linear_all_reduce.default",
}

# TensorCast's DispatchFFNCombinePass (freezing_passes/dispatch_ffn_combine_pass.py,
# `_DFC_OP_MAP_GMM`): init_routing_v2 ... unpermute_tokens around a grouped gate/up GEMM
# with SwiGLU and a grouped down GEMM becomes one call on (x, expert_indices)
_DFC_GATE_UP = {
    "tensor_cast.grouped_matmul_swiglu.default": "tensor_cast.dispatch_ffn_combine.default",
    "tensor_cast.grouped_matmul_quant_swiglu.default":
        "tensor_cast.dispatch_ffn_combine_quant.default",
    "tensor_cast.grouped_matmul_quant_int4_swiglu.default":
        "tensor_cast.dispatch_ffn_combine_quant_int4.default",
    "tensor_cast.grouped_matmul_fp8_swiglu.default": "tensor_cast.dispatch_ffn_combine_fp8.default",
    "tensor_cast.grouped_matmul_mxfp4_swiglu_quant.default":
        "tensor_cast.dispatch_ffn_combine_mxfp4.default",
}
_DFC_DOWN = _ops("tensor_cast.grouped_matmul.default", "tensor_cast.grouped_matmul_quant.default",
                 "tensor_cast.grouped_matmul_quant_int4.default",
                 "tensor_cast.grouped_matmul_fp8.default", "tensor_cast.grouped_matmul_mxfp4.default")

PATTERNS: dict[str, FusionPattern] = {p.name: p for p in (
    FusionPattern(
        name="matmul_all_reduce",
        parts=(frozenset(_MC2_LINEARS), _ops("tensor_cast.all_reduce.default")),
        key_part=0, fused=_MC2_LINEARS, comm_combine="overlap",
        source="tensor_cast/compilation/freezing_passes/patterns/matmul_allreduce.py; "
               "priced max(matmul, all_reduce) by _estimate_matmul_all_reduce "
               "(tensor_cast/performance_model/__init__.py)"),
    FusionPattern(
        name="dispatch_ffn_combine",
        parts=(_ops("tensor_cast.init_routing_v2.default"), _ops("tensor_cast.all_to_all.default"),
               _ops("tensor_cast.cat.default"), frozenset(_DFC_GATE_UP), _DFC_DOWN,
               _ops("aten.cat.default"), _ops("tensor_cast.all_to_all.default"),
               _ops("tensor_cast.unpermute_tokens.default")),
        key_part=3, fused=_DFC_GATE_UP, operation="moe_fused", group="moe.experts",
        comm_combine="serial", optional_parts=frozenset({2}), weights_from=(3, 4),
        source="tensor_cast/compilation/freezing_passes/dispatch_ffn_combine_pass.py; "
               "priced max(compute, memory) + 2 all_to_all by _estimate_dfc_common "
               "(tensor_cast/performance_model/__init__.py)"),
)}


def check_fusions(names: Iterable[str], where: str) -> tuple[str, ...]:
    names = tuple(names)
    for n in names:
        if n not in PATTERNS:
            raise ConfigError(f"unknown fusion {n!r}", source="stacks.yaml", field=where,
                              expected=" | ".join(PATTERNS))
    return names


def apply_fusions(tasks: Sequence[Task], fusions: Iterable[str]) -> list[Task]:
    """`tasks` with every run matching one of `fusions` (applied in the order given)
    replaced by its fused task; deps on a replaced task point at the fused one."""
    out = list(tasks)
    for name in fusions:
        out = _apply(out, PATTERNS[name])
    return out


def _apply(tasks: list[Task], p: FusionPattern) -> list[Task]:
    users: dict[str, set[str]] = {}
    for t in tasks:
        for d in t.deps:
            users.setdefault(d, set()).add(t.lineage)
    out: list[Task] = []
    renamed: dict[str, str] = {}
    i = 0
    while i < len(tasks):
        for v in p.variants():
            n = len(v.parts)
            run = tasks[i:i + n]
            if len(run) == n and _matches(run, v, users):
                fused = fuse(run, v)
                for t in run:
                    renamed[t.lineage] = fused.lineage
                out.append(fused)
                i += n
                break
        else:
            out.append(tasks[i])
            i += 1
    if not renamed:
        return out
    return [_redirect(t, renamed) for t in out]


def _matches(run: list[Task], p: FusionPattern, users: dict[str, set[str]]) -> bool:
    first = run[0]
    for k, (t, ops) in enumerate(zip(run, p.parts)):
        if t.operator not in ops or t.kind is TaskKind.VIEW:
            return False
        if (t.count, t.layers, t.stage, t.devices) != (first.count, first.layers, first.stage,
                                                       first.devices):
            return False
        if k and run[k - 1].lineage not in t.deps:
            return False  # each part feeds the next
    inside = {t.lineage for t in run}
    # an intermediate result read outside the run stays a separate call
    return all(users.get(t.lineage, set()) <= inside for t in run[:-1])


def fuse(run: Sequence[Task], p: FusionPattern) -> Task:
    """The fused task of one matched run (see the module docstring for its work)."""
    key = run[p.key_part]
    inside = {t.lineage for t in run}
    flops = sum(t.work.flops for t in run)
    read = sum(t.work.bytes_read for t in run)
    written = sum(t.work.bytes_written for t in run)
    for a, b in zip(run, run[1:]):
        if a.kind is TaskKind.COMPUTE and b.kind is TaskKind.COMPUTE:
            handed = sum(x.nbytes for x in a.outputs)
            written -= min(a.work.bytes_written, handed)
            read -= min(b.work.bytes_read, handed)
    comms = [t for t in run if t.kind is TaskKind.COMMUNICATION]
    message = sum(t.work.message_bytes for t in comms)
    participants = {t.work.participants for t in comms}
    if len(participants) > 1:
        raise ValueError(f"{p.name}: collectives over different groups {sorted(participants)}")
    axes = dict(key.work.axes)
    for t in run:
        for k, v in t.work.axes.items():
            axes.setdefault(k, v)
    attrs = dict(key.attributes)
    for t in run:
        for k, v in t.attributes.items():
            attrs.setdefault(k, v)
    shards = {t.attributes["weight_shards"] for t in run if "weight_params" in t.attributes}
    if len(shards) > 1:
        raise ValueError(f"{p.name}: parts hold weights split {sorted(shards)} ways")
    for k in SUMMED_ATTRIBUTES:
        vals = [t.attributes[k] for t in run if k in t.attributes]
        if vals:
            attrs[k] = sum(vals)
    attrs["fusion"] = p.name
    attrs["fused_from"] = "+".join(t.operator for t in run)
    # the fused call takes the inputs of part `inputs_from`, so its list arguments too
    attrs.pop("list_inputs", None)
    attrs.pop("weight_list_from", None)
    inputs = run[p.inputs_from].inputs
    if "list_inputs" in run[p.inputs_from].attributes:
        attrs["list_inputs"] = run[p.inputs_from].attributes["list_inputs"]
    if p.weights_from:
        attrs["list_inputs"] = len(inputs)
        for k in p.weights_from:
            part = run[k]
            inputs += part.inputs[int(part.attributes.get("weight_list_from", len(part.inputs))):]
    if comms:
        axes.update(message_bytes=int(message), participants=participants.pop())
        for t in comms:
            if "tier" in t.work.axes:
                axes["tier"] = t.work.axes["tier"]
        attrs.update(comm_operation="+".join(t.operation for t in comms),
                     comm_message_bytes=float(message),
                     comm_participants=int(axes["participants"]))
        # each collective of the fused kernel, for the analytic price (roofline)
        axes.update(comm_collectives="+".join(f"{t.operation}:{int(t.work.message_bytes)}"
                                              for t in comms),
                    comm_combine=p.comm_combine)
    prefix = key.lineage[:len(key.lineage) - len(key.group)]
    group = p.group or key.group
    deps = tuple(dict.fromkeys(d for t in run for d in t.deps if d not in inside))
    return replace(
        key, lineage=prefix + group, group=group, operator=p.fused[key.operator],
        operation=p.operation or key.operation, kind=TaskKind.COMPUTE,
        inputs=inputs, outputs=run[-1].outputs, deps=deps,
        work=Work(flops=flops, engine=key.work.engine, compute_dtype=key.work.compute_dtype,
                  bytes_read=read, bytes_written=written, message_bytes=float(message),
                  participants=int(axes.get("participants", 0)) if comms else 0,
                  axes=FrozenDict(axes)),
        attributes=FrozenDict(attrs))


def _redirect(t: Task, renamed: dict[str, str]) -> Task:
    if not any(d in renamed for d in t.deps):
        return t
    deps = tuple(dict.fromkeys(renamed.get(d, d) for d in t.deps if renamed.get(d) != t.lineage))
    return replace(t, deps=deps)
