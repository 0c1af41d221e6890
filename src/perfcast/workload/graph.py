"""TaskGraph and the builder that model families use to emit exact work."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfcast.core.canonical import Record
from perfcast.core.dtypes import DType, dtype_bytes, engine_dtype
from perfcast.core.frozen import FrozenDict
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.plan_spec import Batch, ParallelPlan
from perfcast.workload.tensors import Engine, Task, TaskKind, TensorSpec, Work


@dataclass(frozen=True)
class Precision(Record):
    """Datatypes of one deployment. `weight` and `activation` are the default for every
    linear; `linear_overrides` maps a lineage group (e.g. `moe.experts`) to a
    (weight, activation) pair; `kv_cache` is the cache storage dtype."""

    weight: str = "bf16"
    activation: str = "bf16"
    kv_cache: str = "bf16"
    attention: str = "bf16"
    linear_overrides: FrozenDict[str, tuple[str, str]] = field(default_factory=FrozenDict)

    def linear(self, group: str) -> tuple[str, str]:
        return self.linear_overrides.get(group, (self.weight, self.activation))

    @staticmethod
    def uniform(dtype: str) -> Precision:
        d = DType(dtype).value
        return Precision(weight=d, activation=d, kv_cache=d, attention=d)


@dataclass(frozen=True)
class MemoryFacts(Record):
    """Bytes resident on the most loaded device for this step (workload facts)."""

    weights: float
    kv_cache: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations


@dataclass(frozen=True)
class TaskGraph(Record):
    """The exact work of one step. Tasks run on one representative device per stage;
    `Task.devices` says how many devices run identical copies."""

    model: ModelSpec
    plan: ParallelPlan
    batch: Batch
    precision: Precision
    tasks: tuple[Task, ...]
    memory: MemoryFacts
    conventions: FrozenDict[str, str] = field(default_factory=FrozenDict)

    DIGEST_DOMAIN = "perfcast.TaskGraph"

    @property
    def num_devices(self) -> int:
        return self.plan.num_devices

    def total_flops(self) -> float:
        """FLOPs of the whole step summed over every device."""
        return sum(t.work.flops * t.count * t.devices for t in self.tasks)

    def total_bytes(self) -> float:
        return sum(t.work.bytes_total * t.count * t.devices for t in self.tasks)

    def param_count(self, *, active: bool = False) -> float:
        """Parameters of the model, reconstructed from the weights the tasks read.

        Each task stores its local weight elements and over how many devices the weight
        is split (`weight_shards`); replicated copies are counted once.
        With `active=True`, experts count only as many as a token activates.
        """
        key = "active_weight_params" if active else "weight_params"
        total = 0.0
        for t in self.tasks:
            local = t.attributes.get(key, t.attributes.get("weight_params", 0))
            total += float(local) * t.count * int(t.attributes.get("weight_shards", 1))
        return total


class GraphBuilder:
    """Collects tasks with stable lineage ids and per-device work.

    Families call the typed helpers (`gemm`, `attention`, `elementwise`, `collective`,
    `view`) which compute FLOPs and bytes from shapes, so no family computes work by hand.
    """

    def __init__(self, model: ModelSpec, plan: ParallelPlan, batch: Batch,
                 precision: Precision) -> None:
        self.model = model
        self.plan = plan
        self.batch = batch
        self.precision = precision
        self.tasks: list[Task] = []
        self._lineages: set[str] = set()
        self.conventions: dict[str, str] = {}

    # -- lineage -------------------------------------------------------------------
    @staticmethod
    def layer_prefix(layers: tuple[int, int] | None) -> str:
        if layers is None:
            return ""
        a, b = layers
        return f"L{a}." if a == b else f"L{a}-{b}."

    def _add(self, task: Task) -> str:
        if task.lineage in self._lineages:
            raise ValueError(f"duplicate lineage id {task.lineage}")
        self._lineages.add(task.lineage)
        self.tasks.append(task)
        return task.lineage

    def _common(self, group: str, layers: tuple[int, int] | None, deps: tuple[str, ...],
                count: int | None, devices: int | None, stage: int) -> dict[str, Any]:
        reps = (layers[1] - layers[0] + 1) if layers else 1
        return dict(lineage=self.layer_prefix(layers) + group, group=group, deps=tuple(deps),
                    count=reps * (count or 1), devices=devices or self.plan.devices_per_stage,
                    stage=stage, layers=layers)

    # -- task helpers ----------------------------------------------------------------
    def gemm(self, group: str, m: int, n: int, k: int, *, layers=None, deps=(),
             weight_dtype: str | None = None, act_dtype: str | None = None,
             out_dtype: str | None = None, operator: str = "aten.mm.default",
             weight_shards: int = 1, batch: int = 1, weight_is_activation: bool = False,
             count: int | None = None, devices: int | None = None, stage: int = 0,
             extra: dict | None = None) -> str:
        """`batch` independent [m,k]x[k,n] products (bmm when batch > 1).

        The weight operand is read once per call (shared across `batch` unless
        `weight_is_activation`, e.g. attention-like batched products)."""
        w_dt, a_dt = self.precision.linear(group)
        w_dt = weight_dtype or w_dt
        a_dt = act_dtype or a_dt
        o_dt = out_dtype or self.precision.activation
        compute = _gemm_compute_dtype(w_dt, a_dt)
        flops = 2.0 * m * n * k * batch
        w_elems = k * n * (batch if weight_is_activation or batch > 1 else 1)
        read = m * k * batch * dtype_bytes(a_dt) + w_elems * dtype_bytes(w_dt)
        read += _scale_bytes(w_dt, w_elems)
        written = m * n * batch * dtype_bytes(o_dt)
        attrs: dict[str, Any] = {"weight_dtype": DType(w_dt).value, "act_dtype": DType(a_dt).value}
        if not weight_is_activation:
            attrs["weight_params"] = w_elems
            attrs["weight_shards"] = weight_shards
            attrs["weight_bytes"] = w_elems * dtype_bytes(w_dt) + _scale_bytes(w_dt, w_elems)
        if extra:
            attrs.update(extra)
        axes = {"m": m, "n": n, "k": k}
        if batch > 1:
            axes["batch"] = batch
        shape_a = (batch, m, k) if batch > 1 else (m, k)
        shape_b = (batch, k, n) if batch > 1 else (k, n)
        shape_o = (batch, m, n) if batch > 1 else (m, n)
        return self._add(Task(
            operator=operator, operation="gemm", kind=TaskKind.COMPUTE,
            inputs=(TensorSpec(shape_a, DType(a_dt).value), TensorSpec(shape_b, DType(w_dt).value)),
            outputs=(TensorSpec(shape_o, DType(o_dt).value),),
            work=Work(flops=flops, engine=Engine.MATRIX, compute_dtype=compute,
                      bytes_read=read, bytes_written=written, axes=FrozenDict(axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def attention(self, group: str, *, q_heads: int, kv_heads: int, qk_head_dim: int,
                  v_head_dim: int, num_requests: int, q_tokens: int, context_tokens: int,
                  window: int | None = None, layers=None, deps=(), kv_dtype: str | None = None,
                  operator: str = "tensor_cast.attention.default", count: int | None = None,
                  devices: int | None = None, stage: int = 0, extra: dict | None = None) -> str:
        """Scaled-dot-product attention of `num_requests` requests, each with `q_tokens`
        new queries over `context_tokens` cached keys plus the new ones (causal).

        FLOPs: 2*heads*(qk_dim + v_dim) per attended (query, key) pair; a query at
        position p attends to min(p + 1, window) keys. Bytes: Q read, K/V of the whole
        attended context read once per request, O written."""
        kv_dt = kv_dtype or self.precision.kv_cache
        a_dt = self.precision.attention
        pairs = attended_pairs(q_tokens, context_tokens, window) * num_requests
        flops = 2.0 * q_heads * (qk_head_dim + v_head_dim) * pairs
        kv_len = context_tokens + q_tokens
        kv_read_len = min(kv_len, window) if window else kv_len
        if window and q_tokens > 1:
            kv_read_len = min(kv_len, window + q_tokens - 1)
        read = (num_requests * q_tokens * q_heads * qk_head_dim * dtype_bytes(a_dt)
                + num_requests * kv_read_len * kv_heads * (qk_head_dim + v_head_dim)
                * dtype_bytes(kv_dt))
        written = num_requests * q_tokens * q_heads * v_head_dim * dtype_bytes(a_dt)
        phase = "decode" if (q_tokens == 1 and context_tokens > 0) else "prefill"
        axes: dict[str, Any] = {"batch": num_requests, "q_tokens": q_tokens, "kv_len": kv_len,
                                "heads": q_heads, "kv_heads": kv_heads, "head_dim": qk_head_dim,
                                "v_head_dim": v_head_dim, "phase": phase,
                                "kv_dtype": DType(kv_dt).value}
        if window:
            axes["window"] = window
        attrs = dict(extra or {})
        return self._add(Task(
            operator=operator, operation="attention", kind=TaskKind.COMPUTE,
            inputs=(TensorSpec((num_requests * q_tokens, q_heads, qk_head_dim), DType(a_dt).value),
                    TensorSpec((num_requests, kv_len, kv_heads, qk_head_dim), DType(kv_dt).value),
                    TensorSpec((num_requests, kv_len, kv_heads, v_head_dim), DType(kv_dt).value)),
            outputs=(TensorSpec((num_requests * q_tokens, q_heads, v_head_dim), DType(a_dt).value),),
            work=Work(flops=flops, engine=Engine.MATRIX, compute_dtype=_attn_compute(a_dt),
                      bytes_read=read, bytes_written=written, axes=FrozenDict(axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def elementwise(self, group: str, operator: str, operation: str, *,
                    inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                    flops: float, layers=None, deps=(), weight_params: int = 0,
                    weight_shards: int = 1, count: int | None = None,
                    devices: int | None = None, stage: int = 0, extra: dict | None = None,
                    extra_bytes_read: float = 0.0) -> str:
        """A vector-engine op whose cost is its bytes and a few FLOPs per element."""
        attrs: dict[str, Any] = dict(extra or {})
        if weight_params:
            attrs["weight_params"] = weight_params
            attrs["weight_shards"] = weight_shards
            attrs["weight_bytes"] = weight_params * dtype_bytes(self.precision.activation)
        read = sum(t.nbytes for t in inputs) + extra_bytes_read
        written = sum(t.nbytes for t in outputs)
        out = outputs[0] if outputs else inputs[0]
        axes = {"tokens": out.shape[0] if out.shape else 1, "numel": out.numel}
        dt = out.dtype
        return self._add(Task(
            operator=operator, operation=operation, kind=TaskKind.COMPUTE,
            inputs=inputs, outputs=outputs,
            work=Work(flops=float(flops), engine=Engine.VECTOR,
                      compute_dtype=dt if dt in ("bf16", "fp16", "fp32") else "fp32",
                      bytes_read=read, bytes_written=written, axes=FrozenDict(axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def collective(self, group: str, operation: str, *, message_bytes: float, participants: int,
                   layers=None, deps=(), dtype: str | None = None, count: int | None = None,
                   devices: int | None = None, stage: int = 0, tier: str = "",
                   extra: dict | None = None) -> str:
        """A collective over `participants` devices; `message_bytes` is the per-device
        buffer (all-gather: the gathered output; reduce-scatter: the full input)."""
        dt = dtype or self.precision.activation
        axes: dict[str, Any] = {"message_bytes": int(message_bytes), "participants": participants}
        if tier:
            axes["tier"] = tier
        return self._add(Task(
            operator=f"tensor_cast.{operation}.default", operation=operation,
            kind=TaskKind.COMMUNICATION,
            inputs=(TensorSpec((int(message_bytes / dtype_bytes(dt)),), DType(dt).value),),
            outputs=(TensorSpec((int(message_bytes / dtype_bytes(dt)),), DType(dt).value),),
            work=Work(flops=0.0, engine=Engine.NETWORK, compute_dtype=DType(dt).value,
                      message_bytes=float(message_bytes), participants=participants,
                      axes=FrozenDict(axes)),
            attributes=FrozenDict(extra or {}),
            **self._common(group, layers, deps, count, devices, stage)))

    def view(self, group: str, operator: str, *, tensor: TensorSpec, layers=None, deps=(),
             stage: int = 0) -> str:
        """A declared zero-cost shape-only op (reshape/view/transpose)."""
        return self._add(Task(
            operator=operator, operation="view", kind=TaskKind.VIEW, inputs=(tensor,),
            outputs=(tensor,), work=Work(engine=Engine.NONE, compute_dtype=tensor.dtype),
            **self._common(group, layers, deps, None, None, stage)))

    def build(self, memory: MemoryFacts) -> TaskGraph:
        return TaskGraph(model=self.model, plan=self.plan, batch=self.batch,
                         precision=self.precision, tasks=tuple(self.tasks), memory=memory,
                         conventions=FrozenDict(self.conventions))


def attended_pairs(q_tokens: int, context_tokens: int, window: int | None = None) -> float:
    """Number of (query, key) pairs of one request under causal masking.

    Query i (1-based) of the new tokens sees context_tokens + i keys, capped by `window`."""
    q, c = q_tokens, context_tokens
    if not window or c + q <= window:
        return q * c + q * (q + 1) / 2
    # positions p = c+1 .. c+q ; keys = min(p, window)
    full_start = max(c + 1, window)  # from here on every query sees `window` keys
    if full_start > c + q:
        return q * c + q * (q + 1) / 2
    n_full = c + q - full_start + 1
    n_partial = q - n_full
    partial = sum_range(c + 1, c + n_partial) if n_partial > 0 else 0
    return n_full * window + partial


def sum_range(a: int, b: int) -> float:
    return (a + b) * (b - a + 1) / 2 if b >= a else 0.0


def _gemm_compute_dtype(weight: str, act: str) -> str:
    """Math dtype of a linear: the wider of weight and activation for weight-only quant."""
    w, a = DType(weight), DType(act)
    if w in (DType.INT4, DType.INT8) and a in (DType.BF16, DType.FP16):
        return a.value  # weight-only: dequantise to activation dtype
    if w in (DType.NVFP4, DType.MXFP4, DType.FP4) and a in (DType.NVFP4, DType.MXFP4, DType.FP4):
        return engine_dtype(w).value
    if w in (DType.NVFP4, DType.MXFP4, DType.FP4):
        return a.value if a not in (DType.FP8, DType.FP8_BLOCK) else "fp8"
    if w in (DType.FP8, DType.FP8_BLOCK) and a in (DType.FP8, DType.FP8_BLOCK):
        return "fp8"
    if w in (DType.FP8, DType.FP8_BLOCK):
        return a.value
    if w is DType.INT8 and a is DType.INT8:
        return "int8"
    return a.value


def _attn_compute(dtype: str) -> str:
    d = DType(dtype)
    return "fp8" if d in (DType.FP8, DType.FP8_BLOCK) else d.value


def _scale_bytes(weight_dtype: str, elems: int) -> float:
    """Bytes of quantisation scales stored with a weight (fp32 unless stated)."""
    d = DType(weight_dtype)
    if d is DType.FP8_BLOCK:
        return elems / (128 * 128) * 4
    if d is DType.NVFP4:
        return elems / 16 * 1  # one fp8 scale per 16 elements
    if d is DType.MXFP4:
        return elems / 32 * 1  # one e8m0 scale per 32 elements
    if d is DType.INT4:
        return elems / 128 * 2  # one bf16 scale per group of 128
    return 0.0
