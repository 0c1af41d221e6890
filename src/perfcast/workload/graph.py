"""TaskGraph and the builder that model families use to emit exact work."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from perfcast.core.canonical import Record
from perfcast.core.dtypes import DType, dtype_bytes, engine_dtype
from perfcast.core.frozen import FrozenDict
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.plan_spec import Batch, ParallelPlan
from perfcast.workload.stacks import OpStack, load_stack
from perfcast.workload.tensors import Engine, Task, TaskKind, TensorSpec, Work


# TensorCast operator of a linear whose weight is stored quantised (data, not code paths).
QUANT_LINEAR_OPERATORS: dict[str, str] = {
    "fp8": "tensor_cast.fp8_linear.default",
    "fp8_block": "tensor_cast.fp8_linear.default",
    "int8": "tensor_cast.static_quant_linear.default",
    "int4": "tensor_cast.static_quant_linear_int4.default",
    "mxfp4": "tensor_cast.mxfp4_linear.default",
    "nvfp4": "tensor_cast.mxfp4_linear.default",
    "fp4": "tensor_cast.mxfp4_linear.default",
}

# Quantised linears TensorCast calls with two 0-d scale tensors after x and the weight.
TENSORCAST_SCALED_LINEARS = frozenset({"tensor_cast.static_quant_linear.default"})

# Grouped (MoE expert) GEMM operator by expert weight dtype.
GROUPED_GEMM_OPERATORS: dict[str, str] = {
    "fp8": "tensor_cast.grouped_matmul_fp8.default",
    "fp8_block": "tensor_cast.grouped_matmul_fp8.default",
    "int8": "tensor_cast.grouped_matmul_quant.default",
    "int4": "tensor_cast.grouped_matmul_quant_int4.default",
    "mxfp4": "tensor_cast.grouped_matmul_mxfp4.default",
    "nvfp4": "tensor_cast.grouped_matmul_mxfp4.default",
    "fp4": "tensor_cast.grouped_matmul_mxfp4.default",
}


# Attention operator when attention math is quantised (int8/fp8 Q, K, V).
QUANT_ATTENTION_OPERATORS: dict[str, str] = {
    "tensor_cast.attention.default": "tensor_cast.attention_quant.default",
    "tensor_cast.multihead_latent_attention.default":
        "tensor_cast.multihead_latent_attention_quant.default",
}


@dataclass(frozen=True)
class Precision(Record):
    """Datatypes of one deployment. `weight` is every linear's default weight dtype and
    `linear_activation` its input dtype (empty: `activation`, the dtype of all other
    activations); `linear_overrides` maps a lineage group (e.g. `moe.experts`) to a
    (weight, activation) pair; `kv_cache` is the cache storage dtype; `attention` the
    math dtype of attention (Q and O)."""

    weight: str = "bf16"
    activation: str = "bf16"
    kv_cache: str = "bf16"
    attention: str = "bf16"
    linear_overrides: FrozenDict[str, tuple[str, str]] = field(default_factory=FrozenDict)
    linear_activation: str = ""

    def linear(self, group: str) -> tuple[str, str]:
        """(weight, activation) dtypes of the linear in lineage group `group`. The most
        specific override wins: `moe.experts.gate_up` falls back to `moe.experts`, then
        `moe`, then the defaults."""
        key = group
        while True:
            hit = self.linear_overrides.get(key)
            if hit is not None:
                return tuple(hit)  # type: ignore[return-value]
            if "." not in key:
                return (self.weight, self.linear_activation or self.activation)
            key = key.rsplit(".", 1)[0]

    @staticmethod
    def uniform(dtype: str) -> Precision:
        d = _value(dtype)
        return Precision(weight=d, activation=d, kv_cache=d, attention=d)


@dataclass(frozen=True)
class MemoryFacts(Record):
    """Bytes resident on the most loaded device for this step (workload facts).

    * `weights`: parameters after sharding and quantisation (scales included);
    * `kv_cache`: the cache of this step's requests (MLA-compressed where applicable,
      sliding-window layers hold at most `window` tokens, optional paged-block rounding);
    * `activations`: peak live activations of the step (largest op plus the residual);
    * `reserve`: framework reserve (workspace, CUDA graphs, allocator slack) as declared;
    * `kv_bytes_per_token`: ((window or 0), bytes) pairs: cache bytes one token of one
      request adds on this device, summed over the layers with that window;
    * `dp_ranks`: attention data-parallel ranks; each holds its share of the requests;
    * `activations_per_token`: `activations` / the step's tokens per device, so that
      `max_batch_for` can scale the activation peak with the batch;
    * `state_bytes_per_request`: fixed per-request cache (recurrent-layer state) that
      families declare with a task attribute of the same name.
    """

    weights: float
    kv_cache: float
    activations: float
    reserve: float = 0.0
    kv_bytes_per_token: tuple[tuple[int, float], ...] = ()
    dp_ranks: int = 1
    block_size: int = 0
    activations_per_token: float = 0.0
    state_bytes_per_request: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.reserve

    def kv_bytes_per_request(self, context_tokens: int) -> float:
        """Cache bytes one request of `context_tokens` tokens occupies on this device."""
        total = self.state_bytes_per_request
        for window, per_token in self.kv_bytes_per_token:
            tokens = min(context_tokens, window) if window else context_tokens
            if self.block_size:
                tokens = -(-tokens // self.block_size) * self.block_size
            total += tokens * per_token
        return total

    def max_batch_for(self, context_tokens: int, capacity_bytes: float, *,
                      query_tokens: int = 1) -> int:
        """Most concurrent requests of `context_tokens` cached tokens each that fit in
        `capacity_bytes` per device, over all attention-DP ranks, when each computes
        `query_tokens` new tokens per step. Weights and reserve stay resident; the
        activation peak grows by `activations_per_token` per new token (or stays at
        `activations` when unknown). 0 when even one request does not fit."""
        if context_tokens < 1:
            raise ValueError("context_tokens must be positive")
        free = capacity_bytes - self.weights - self.reserve
        per_request = self.kv_bytes_per_request(context_tokens)
        if self.activations_per_token:
            per_request += self.activations_per_token * query_tokens
        else:
            free -= self.activations
        if free <= 0:
            return 0
        if per_request <= 0:
            raise ValueError("the model holds no KV cache; the batch is not memory-bound")
        return int(free // per_request) * self.dp_ranks


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

    def unique_flops(self) -> float:
        """FLOPs of the whole step with redundant copies counted once: a task that
        `replicas` devices compute identically (e.g. MLA's replicated down-projections
        under TP) counts once. Equal to the single-device FLOPs for every layout."""
        return sum(t.work.flops * t.count * t.devices / float(t.attributes.get("replicas", 1))
                   for t in self.tasks)

    def total_bytes(self) -> float:
        return sum(t.work.bytes_total * t.count * t.devices for t in self.tasks)

    def param_count(self, *, active: bool = False, embedding: bool = True) -> float:
        """Parameters of the model, reconstructed from the weights the tasks read.

        Each task stores its local weight elements and over how many devices the weight
        is split (`weight_shards`); replicated copies are counted once. Tasks repeated
        over layers count once per layer (`layer_count`), not once per call.
        With `active=True`, experts count only as many as a token activates.
        `embedding=False` leaves out the input-embedding table (publishers differ: Qwen
        counts it among activated parameters, OpenAI's gpt-oss card does not).
        """
        key = "active_weight_params" if active else "weight_params"
        total = 0.0
        for t in self.tasks:
            if not embedding and t.operation == "embedding":
                continue
            local = t.attributes.get(key, t.attributes.get("weight_params", 0))
            if not local:
                continue
            reps = int(t.attributes.get("layer_count", t.count))
            total += float(local) * reps * float(t.attributes.get("weight_shards", 1))
        return total


class GraphBuilder:
    """Collects tasks with stable lineage ids and per-device work.

    Families call the typed helpers (`gemm`, `attention`, `elementwise`, `collective`,
    `view`) which compute FLOPs and bytes from shapes, so no family computes work by hand.
    """

    def __init__(self, model: ModelSpec, plan: ParallelPlan, batch: Batch,
                 precision: Precision, options: dict[str, Any] | None = None) -> None:
        self.model = model
        self.plan = plan
        self.batch = batch
        # what one attention-DP rank (and each of its TP devices) computes
        self.local_batch = batch.per_dp_rank(plan.dp)
        self.precision = precision
        self.options: dict[str, Any] = dict(options or {})
        stack = self.options.get("stack", "default")
        self.stack: OpStack = stack if isinstance(stack, OpStack) else load_stack(stack)
        self.tasks: list[Task] = []
        # tasks emitted once per step and shared by layers (e.g. the RoPE table gathers)
        self.step_tasks: dict[Any, Any] = {}
        self._lineages: set[str] = set()
        self.conventions: dict[str, str] = {}

    # -- lineage -------------------------------------------------------------------
    @staticmethod
    def layer_prefix(layers: tuple[int, ...] | None) -> str:
        """`L3.` for one layer, `L3-60.` for a contiguous run, `L0-34:2.` for every
        second layer from 0 to 34 (alternating patterns such as gpt-oss)."""
        if layers is None:
            return ""
        a, b = layers[0], layers[1]
        step = layers[2] if len(layers) > 2 else 1
        if a == b:
            return f"L{a}."
        return f"L{a}-{b}." if step == 1 else f"L{a}-{b}:{step}."

    @staticmethod
    def layer_count(layers: tuple[int, ...] | None) -> int:
        if not layers:
            return 1
        step = layers[2] if len(layers) > 2 else 1
        return len(range(layers[0], layers[1] + 1, step))

    def _add(self, task: Task) -> str:
        if task.lineage in self._lineages:
            raise ValueError(f"duplicate lineage id {task.lineage}")
        prefix = task.lineage.split(".", 1)[0]
        if task.layers and ":" in prefix:  # strided run: `layers` spans, `count` repeats
            task = replace(task, attributes=task.attributes.replace(
                layer_step=int(prefix.rsplit(":", 1)[1])))
        self._lineages.add(task.lineage)
        self.tasks.append(task)
        return task.lineage

    def _common(self, group: str, layers: tuple[int, int] | None, deps: tuple[str, ...],
                count: int | None, devices: int | None, stage: int) -> dict[str, Any]:
        reps = self.layer_count(layers)
        return dict(lineage=self.layer_prefix(layers) + group, group=group, deps=tuple(deps),
                    count=reps * (count or 1), devices=devices or self.plan.devices_per_stage,
                    stage=stage, layers=(layers[0], layers[1]) if layers else None)

    # -- task helpers ----------------------------------------------------------------
    def gemm(self, group: str, m: int, n: int, k: int, *, layers=None, deps=(),
             weight_dtype: str | None = None, act_dtype: str | None = None,
             out_dtype: str | None = None, operator: str = "aten.mm.default",
             weight_shards: int = 1, batch: int = 1, weight_is_activation: bool = False,
             count: int | None = None, devices: int | None = None, stage: int = 0,
             extra: dict | None = None, replicas: int = 1, axes: dict | None = None) -> str:
        """`batch` independent [m,k]x[k,n] products (bmm when batch > 1).

        The weight operand is read once per call (shared across `batch` unless
        `weight_is_activation`, e.g. attention-like batched products). A quantised
        weight turns the default `aten.mm.default` into TensorCast's quantised linear
        (`QUANT_LINEAR_OPERATORS`). `replicas`: devices computing the same product
        redundantly (counted once by `TaskGraph.unique_flops`); `axes` adds lookup axes."""
        w_dt, a_dt = self.precision.linear(group)
        w_dt = weight_dtype or w_dt
        a_dt = act_dtype or a_dt
        if operator == "aten.mm.default" and not weight_is_activation:
            operator = QUANT_LINEAR_OPERATORS.get(_value(w_dt), operator)
        o_dt = out_dtype or self.precision.activation
        compute = _gemm_compute_dtype(w_dt, a_dt)
        flops = 2.0 * m * n * k * batch
        w_elems = k * n * (batch if weight_is_activation or batch > 1 else 1)
        read = m * k * batch * dtype_bytes(a_dt) + w_elems * dtype_bytes(w_dt)
        read += _scale_bytes(w_dt, w_elems)
        written = m * n * batch * dtype_bytes(o_dt)
        attrs: dict[str, Any] = {"weight_dtype": _value(w_dt), "act_dtype": _value(a_dt)}
        if not weight_is_activation:
            attrs["weight_params"] = w_elems
            attrs["weight_shards"] = weight_shards
            attrs["weight_bytes"] = w_elems * dtype_bytes(w_dt) + _scale_bytes(w_dt, w_elems)
        if replicas > 1:
            attrs["replicas"] = replicas
        if extra:
            attrs.update(extra)
        extra_axes = axes
        axes = {"m": m, "n": n, "k": k}
        if batch > 1:
            axes["batch"] = batch
        if extra_axes:
            axes.update(extra_axes)
        shape_a = (batch, m, k) if batch > 1 else (m, k)
        shape_b = (batch, k, n) if batch > 1 else (k, n)
        shape_o = (batch, m, n) if batch > 1 else (m, n)
        inputs = (TensorSpec(shape_a, _value(a_dt)), TensorSpec(shape_b, _value(w_dt)))
        if self.stack.tensorcast_tensors and operator in TENSORCAST_SCALED_LINEARS:
            inputs += (TensorSpec((), "fp32"), TensorSpec((), "fp32"))  # scale, offset
        return self._add(Task(
            operator=operator, operation="gemm", kind=TaskKind.COMPUTE,
            inputs=inputs,
            outputs=(TensorSpec(shape_o, _value(o_dt)),),
            work=Work(flops=flops, engine=Engine.MATRIX, compute_dtype=compute,
                      bytes_read=read, bytes_written=written, axes=FrozenDict(axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def attention(self, group: str, *, q_heads: int, kv_heads: int, qk_head_dim: int,
                  v_head_dim: int, num_requests: int, q_tokens: int, context_tokens: int,
                  window: int | None = None, layers=None, deps=(), kv_dtype: str | None = None,
                  operator: str = "tensor_cast.attention.default", count: int | None = None,
                  devices: int | None = None, stage: int = 0, extra: dict | None = None,
                  operation: str = "attention", axes: dict | None = None,
                  cache_bytes_per_token: float | None = None, chunk: int | None = None,
                  signature: tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] | None = None
                  ) -> str:
        """Scaled-dot-product attention of `num_requests` requests, each with `q_tokens`
        new queries over `context_tokens` cached keys plus the new ones (causal).

        FLOPs: 2*heads*(qk_dim + v_dim) per attended (query, key) pair; a query at
        position p attends to min(p + 1, window) keys. Bytes: Q read, K/V of the whole
        attended context read once per request, O written.

        `cache_bytes_per_token`: KV-cache bytes one token of one request occupies on this
        device for one layer (default: K and V of the local KV heads); the memory model
        sums it over layers. MLA's absorbed form reads the compressed latent (kv_heads=1,
        qk_head_dim = kv_lora_rank + rope, v_head_dim = kv_lora_rank, shared K/V).

        `chunk` (chunked local attention, Llama-4): a query at position p attends only to
        the keys of its own chunk of `chunk` tokens, ((p - 1) mod chunk) + 1 of them; K/V
        are read from the start of the first query's chunk; the cache holds one chunk.

        `signature`: (inputs, outputs) the call receives when the stack passes other
        tensors than q/K/V (the paged cache and its index tensors); work is unchanged."""
        extra_axes = axes
        kv_dt = kv_dtype or self.precision.kv_cache
        a_dt = self.precision.attention
        if _member(a_dt) in (DType.INT8, DType.FP8):
            operator = QUANT_ATTENTION_OPERATORS.get(operator, operator)
        if chunk:
            pairs = chunked_pairs(q_tokens, context_tokens, chunk) * num_requests
        else:
            pairs = attended_pairs(q_tokens, context_tokens, window) * num_requests
        flops = 2.0 * q_heads * (qk_head_dim + v_head_dim) * pairs
        kv_len = context_tokens + q_tokens
        kv_read_len = min(kv_len, window) if window else kv_len
        if window and q_tokens > 1:
            kv_read_len = min(kv_len, window + q_tokens - 1)
        if chunk:
            kv_read_len = kv_len - (context_tokens // chunk) * chunk
        kv_width = kv_heads * (qk_head_dim + v_head_dim)
        if extra and extra.get("shared_kv"):
            kv_width = kv_heads * qk_head_dim  # MLA latent: V is a slice of K
        read = (num_requests * q_tokens * q_heads * qk_head_dim * dtype_bytes(a_dt)
                + num_requests * kv_read_len * kv_width * dtype_bytes(kv_dt))
        written = num_requests * q_tokens * q_heads * v_head_dim * dtype_bytes(a_dt)
        phase = "decode" if (q_tokens == 1 and context_tokens > 0) else "prefill"
        axes: dict[str, Any] = {"batch": num_requests, "q_tokens": q_tokens, "kv_len": kv_len,
                                "heads": q_heads, "kv_heads": kv_heads, "head_dim": qk_head_dim,
                                "v_head_dim": v_head_dim, "phase": phase,
                                "kv_dtype": _value(kv_dt)}
        if window:
            axes["window"] = window
        if chunk:
            axes["attention_chunk"] = chunk
        if extra_axes:
            axes.update(extra_axes)
        attrs = dict(extra or {})
        if cache_bytes_per_token is None:
            cache_bytes_per_token = kv_heads * (qk_head_dim + v_head_dim) * dtype_bytes(kv_dt)
        attrs["kv_cache_bytes_per_token"] = float(cache_bytes_per_token)
        attrs["cache_window"] = int(window or chunk or 0)
        inputs, outputs = signature or (
            (TensorSpec((num_requests * q_tokens, q_heads, qk_head_dim), _value(a_dt)),
             TensorSpec((num_requests, kv_len, kv_heads, qk_head_dim), _value(kv_dt)),
             TensorSpec((num_requests, kv_len, kv_heads, v_head_dim), _value(kv_dt))),
            (TensorSpec((num_requests * q_tokens, q_heads, v_head_dim), _value(a_dt)),))
        return self._add(Task(
            operator=operator, operation=operation, kind=TaskKind.COMPUTE,
            inputs=inputs, outputs=outputs,
            work=Work(flops=flops, engine=Engine.MATRIX, compute_dtype=_attn_compute(a_dt),
                      bytes_read=read, bytes_written=written, axes=FrozenDict(axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def elementwise(self, group: str, operator: str, operation: str, *,
                    inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                    flops: float, layers=None, deps=(), weight_params: int = 0,
                    weight_shards: int = 1, count: int | None = None,
                    devices: int | None = None, stage: int = 0, extra: dict | None = None,
                    extra_bytes_read: float = 0.0, replicas: int = 1,
                    axes: dict | None = None,
                    signature: tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] | None = None
                    ) -> str:
        """A vector-engine op whose cost is its bytes and a few FLOPs per element.
        `axes` adds lookup axes to the default `tokens` (output rows) and `numel`.
        Work and axes come from `inputs`/`outputs`; `signature` (inputs, outputs) is what
        the call receives when the stack passes other tensors (a [1, T, h] view, a
        resident table, a cache written in place)."""
        attrs: dict[str, Any] = dict(extra or {})
        if replicas > 1:
            attrs["replicas"] = replicas
        if weight_params:
            attrs["weight_params"] = weight_params
            attrs["weight_shards"] = weight_shards
            attrs["weight_bytes"] = weight_params * dtype_bytes(self.precision.activation)
        read = sum(t.nbytes for t in inputs) + extra_bytes_read
        written = sum(t.nbytes for t in outputs)
        out = outputs[0] if outputs else inputs[0]
        all_axes = {"tokens": out.shape[0] if out.shape else 1, "numel": out.numel}
        all_axes.update(axes or {})
        dt = out.dtype
        if signature is not None:
            inputs, outputs = signature
        return self._add(Task(
            operator=operator, operation=operation, kind=TaskKind.COMPUTE,
            inputs=inputs, outputs=outputs,
            work=Work(flops=float(flops), engine=Engine.VECTOR,
                      compute_dtype=dt if dt in ("bf16", "fp16", "fp32") else "fp32",
                      bytes_read=read, bytes_written=written, axes=FrozenDict(all_axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def compute(self, group: str, operator: str, operation: str, *, flops: float,
                bytes_read: float, bytes_written: float, inputs: tuple[TensorSpec, ...],
                outputs: tuple[TensorSpec, ...], axes: dict, engine: Engine = Engine.MATRIX,
                compute_dtype: str | None = None, layers=None, deps=(),
                count: int | None = None, devices: int | None = None, stage: int = 0,
                extra: dict | None = None, replicas: int = 1) -> str:
        """A compute op whose exact work a family derives from its own documented formula
        (gated-delta-rule scans, the DSA indexer, sparse MLA): FLOPs, bytes and lookup
        axes are given, not derived from shapes. Weights, caches and per-request state
        are declared through `extra` (`weight_params`/`weight_shards`/`weight_bytes`,
        `kv_cache_bytes_per_token` + `cache_window`, `state_bytes_per_request`)."""
        attrs: dict[str, Any] = dict(extra or {})
        if replicas > 1:
            attrs["replicas"] = replicas
        dt = compute_dtype or self.precision.activation
        return self._add(Task(
            operator=operator, operation=operation, kind=TaskKind.COMPUTE,
            inputs=inputs, outputs=outputs,
            work=Work(flops=float(flops), engine=engine, compute_dtype=_value(dt),
                      bytes_read=float(bytes_read), bytes_written=float(bytes_written),
                      axes=FrozenDict(axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, count, devices, stage)))

    def collective(self, group: str, operation: str, *, message_bytes: float, participants: int,
                   layers=None, deps=(), dtype: str | None = None, count: int | None = None,
                   devices: int | None = None, stage: int = 0, tier: str = "",
                   extra: dict | None = None,
                   shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> str:
        """A collective over `participants` devices; `message_bytes` is the per-device
        buffer (all-gather: the gathered output; reduce-scatter: the full input).
        `shapes`: (input, output) tensor shapes the call receives (default: flat)."""
        dt = dtype or self.precision.activation
        flat = (int(message_bytes / dtype_bytes(dt)),)
        in_shape, out_shape = shapes or (flat, flat)
        axes: dict[str, Any] = {"message_bytes": int(message_bytes), "participants": participants}
        if tier:
            axes["tier"] = tier
        return self._add(Task(
            operator=f"tensor_cast.{operation}.default", operation=operation,
            kind=TaskKind.COMMUNICATION,
            inputs=(TensorSpec(in_shape, _value(dt)),),
            outputs=(TensorSpec(out_shape, _value(dt)),),
            work=Work(flops=0.0, engine=Engine.NETWORK, compute_dtype=_value(dt),
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

    def moe_experts(self, group: str, *, pairs: float, hidden: int, inter_local: int,
                    local_experts: int, active_local_experts: float, weight_shards: int,
                    active_weight_params: float, gated: bool = True, bias: bool = False,
                    moe_tp: int = 1, layers=None, deps=(), stage: int = 0,
                    devices: int | None = None, axes: dict | None = None,
                    extra: dict | None = None) -> str:
        """The routed-expert FFN of one MoE layer on one device, as one fused task:
        grouped gate/up GEMM, activation, grouped down GEMM over `pairs` routed
        (token, expert) rows (fractional: an expected value under the routing model).

        FLOPs: 2*pairs*hidden*up_n + 2*pairs*inter*hidden + 5*pairs*inter (up_n = 2*inter
        when gated). Bytes: routed rows in, the weights of the `active_local_experts` that
        receive at least one row (plus their scales), the intermediate tensors written and
        read back, rows out. Resident weights: all `local_experts`. With `bias`, the
        gate/up bias is split like its weight and the down bias is held whole by each of
        the `moe_tp` ranks (counted once in `weight_params`)."""
        w_dt, a_dt = self.precision.linear(group)
        o_dt = self.precision.activation
        up_n = (2 if gated else 1) * inter_local
        per_expert = hidden * up_n + inter_local * hidden
        bias_elems = (up_n + hidden) if bias else 0
        flops = (2.0 * pairs * hidden * up_n + 2.0 * pairs * inter_local * hidden
                 + (5.0 if gated else 1.0) * pairs * inter_local)
        w_b, a_b, o_b = dtype_bytes(w_dt), dtype_bytes(a_dt), dtype_bytes(o_dt)
        active_w = active_local_experts * per_expert
        read = (pairs * hidden * a_b + active_w * w_b + _scale_bytes(w_dt, active_w)
                + active_local_experts * bias_elems * o_b + pairs * (up_n + inter_local) * o_b)
        written = pairs * (up_n + inter_local + hidden) * o_b
        resident = local_experts * per_expert
        rows = max(1, math.ceil(pairs))
        attrs: dict[str, Any] = {
            "weight_dtype": _value(w_dt), "act_dtype": _value(a_dt),
            "weight_params": resident + local_experts * (
                (up_n + hidden / moe_tp) if bias else 0),
            "weight_shards": weight_shards, "active_weight_params": active_weight_params,
            "weight_bytes": resident * w_b + _scale_bytes(w_dt, resident)
            + local_experts * bias_elems * o_b,
            "routed_rows": float(pairs), "active_local_experts": float(active_local_experts),
            "fused": "gate_up+act+down",
        }
        attrs.update(extra or {})
        all_axes: dict[str, Any] = {"m": rows, "n": up_n, "k": hidden}
        all_axes.update(axes or {})
        return self._add(Task(
            operator=GROUPED_GEMM_OPERATORS.get(_value(w_dt),
                                                "tensor_cast.grouped_matmul.default"),
            operation="moe", kind=TaskKind.COMPUTE,
            inputs=(TensorSpec((rows, hidden), _value(a_dt)),
                    TensorSpec((local_experts, hidden, up_n), _value(w_dt)),
                    TensorSpec((local_experts, inter_local, hidden), _value(w_dt))),
            outputs=(TensorSpec((rows, hidden), _value(o_dt)),),
            work=Work(flops=flops, engine=Engine.MATRIX,
                      compute_dtype=_gemm_compute_dtype(w_dt, a_dt), bytes_read=read,
                      bytes_written=written, axes=FrozenDict(all_axes)),
            attributes=FrozenDict(attrs),
            **self._common(group, layers, deps, None, devices, stage)))

    def fuse(self, lineages: tuple[str, ...], primary: str, *, operator: str | None = None,
             inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...] | None = None,
             group: str | None = None, operation: str | None = None,
             axes: dict | None = None, extra: dict | None = None) -> str:
        """Replace the tasks `lineages` (just emitted, all of one run) by one call with
        their summed work, as a framework that runs them inside one operator records it
        (TensorCast's `mlapo`, its MLA holding both absorb bmms). The fused task keeps
        the `primary` task's lineage, operator, operation, axes and attributes unless
        `group`/`operator`/`operation` are given; deps are those of the first task,
        outputs (unless given) those of the last. Weights (`weight_params`,
        `weight_bytes`) add up; `weight_shards` and `replicas` become the weighted means
        that keep `param_count` and `unique_flops` exact; axis `kernel_launches` counts
        the parts' kernels (the analytic model launches each). `axes`/`extra` add lookup
        axes / attributes."""
        parts = [t for t in self.tasks if t.lineage in lineages]
        if len(parts) != len(lineages) or any(t.count != parts[0].count for t in parts):
            raise ValueError(f"cannot fuse {lineages}: not all emitted with one count")
        head = next(t for t in parts if t.lineage == primary)
        attrs = dict(head.attributes)
        params = [float(t.attributes.get("weight_params", 0)) for t in parts]
        for key in ("weight_params", "weight_bytes"):
            total = sum(float(t.attributes.get(key, 0)) for t in parts)
            if total:
                attrs[key] = total
        if sum(params):
            shards = [float(t.attributes.get("weight_shards", 1)) for t in parts]
            mean = sum(p * n for p, n in zip(params, shards)) / sum(params)
            attrs["weight_shards"] = int(mean) if mean == int(mean) else mean
        flops = sum(t.work.flops for t in parts)
        unique = sum(t.work.flops / float(t.attributes.get("replicas", 1)) for t in parts)
        attrs.pop("replicas", None)
        if flops and unique and flops != unique:
            reps = flops / unique
            attrs["replicas"] = int(reps) if reps == int(reps) else reps
        attrs["fused_parts"] = ",".join(t.group for t in parts)
        attrs.update(extra or {})
        w = head.work
        launches = sum(int(t.work.axes.get("kernel_launches", 1)) for t in parts)
        work = replace(w, flops=flops, bytes_read=sum(t.work.bytes_read for t in parts),
                       bytes_written=sum(t.work.bytes_written for t in parts),
                       axes=w.axes.replace(kernel_launches=launches, **(axes or {})))
        changes: dict[str, Any] = {}
        if group:
            changes.update(group=group, lineage=head.lineage[:-len(head.group)] + group)
        fused = replace(head, operator=operator or head.operator,
                        operation=operation or head.operation, inputs=inputs,
                        outputs=outputs or parts[-1].outputs, work=work, deps=parts[0].deps,
                        attributes=FrozenDict(attrs), **changes)
        self.tasks = [t for t in self.tasks if t.lineage not in lineages]
        self._lineages.difference_update(lineages)
        return self._add(fused)

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


def chunked_pairs(q_tokens: int, context_tokens: int, chunk: int) -> float:
    """(query, key) pairs of one request under chunked local attention: the query at
    position p (1-based) sees ((p - 1) mod chunk) + 1 keys, its chunk's keys up to p."""
    def upto(n: int) -> float:  # sum over positions 1..n
        full, rest = divmod(n, chunk)
        return full * chunk * (chunk + 1) / 2 + rest * (rest + 1) / 2
    return upto(context_tokens + q_tokens) - upto(context_tokens)


def sum_range(a: int, b: int) -> float:
    return (a + b) * (b - a + 1) / 2 if b >= a else 0.0


_MEMBERS: dict[str, DType] = {d.value: d for d in DType}


def _member(dtype: str) -> DType:
    """`DType(dtype)` (the same member, or the same error), without the enum call."""
    hit = _MEMBERS.get(dtype)
    return hit if hit is not None else DType(dtype)


def _value(dtype: str) -> str:
    """`DType(dtype).value`."""
    return _member(dtype).value


_COMPUTE: dict[tuple[str, str], str] = {}


def _gemm_compute_dtype(weight: str, act: str) -> str:
    """Math dtype of a linear: the wider of weight and activation for weight-only quant."""
    key = (weight, act)
    hit = _COMPUTE.get(key)
    if hit is None:
        hit = _COMPUTE[key] = _gemm_compute(weight, act)
    return hit


def _gemm_compute(weight: str, act: str) -> str:
    w, a = _member(weight), _member(act)
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
    d = _member(dtype)
    return "fp8" if d in (DType.FP8, DType.FP8_BLOCK) else d.value


def _scale_bytes(weight_dtype: str, elems: int) -> float:
    """Bytes of quantisation scales stored with a weight (fp32 unless stated)."""
    d = _member(weight_dtype)
    if d is DType.FP8_BLOCK:
        return elems / (128 * 128) * 4
    if d is DType.NVFP4:
        return elems / 16 * 1  # one fp8 scale per 16 elements
    if d is DType.MXFP4:
        return elems / 32 * 1  # one e8m0 scale per 32 elements
    if d is DType.INT4:
        return elems / 128 * 2  # one bf16 scale per group of 128
    return 0.0
