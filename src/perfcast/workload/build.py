"""Entry point of the workload layer: (model, plan, batch, precision) -> TaskGraph."""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.families import family_for
from perfcast.workload.families import dense as dense_family
from perfcast.workload.families.common import embedding, lm_head
from perfcast.workload.graph import GraphBuilder, MemoryFacts, Precision, TaskGraph
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.plan_spec import Batch, ParallelPlan

LOGITS_MODES = ("last", "all")


def build_task_graph(model: ModelSpec, plan: ParallelPlan, batch: Batch,
                     precision: Precision | None = None, *, logits: str = "last") -> TaskGraph:
    """Build the exact work of one step on one representative device per stage.

    Conventions (also stored in `TaskGraph.conventions`):
    * attention is causal: a new token at position p attends to p keys (sliding window
      caps it); FLOPs = 2*heads*(qk_dim+v_dim) per (query, key) pair;
    * `logits="last"` computes the LM head for one position per request (what serving
      engines do); `"all"` for every token (training-style scoring);
    * GEMM FLOPs are 2*m*n*k; norms, RoPE and activations count a few FLOPs per element.
    """
    if logits not in LOGITS_MODES:
        raise ConfigError(f"unknown logits mode {logits!r}", field="logits",
                          expected=" | ".join(LOGITS_MODES))
    if plan.pp > model.num_layers:
        raise ConfigError(f"pp_size={plan.pp} exceeds num_hidden_layers={model.num_layers}",
                          field="pp_size", expected="at most the number of layers")
    precision = precision or Precision.uniform(model.weight_dtype)
    builder = GraphBuilder(model, plan, batch, precision)
    builder.conventions.update({
        "attention": "causal; FLOPs = 2*heads*(qk_dim+v_dim) per attended (query,key) pair",
        "logits": logits,
        "gemm_flops": "2*m*n*k",
        "work_scope": "per device per call; totals multiply by count and devices",
    })
    family = family_for(model.model_type, model.source)
    tokens = batch.tokens
    last = embedding(builder, tokens, stage=0)
    stage_layers = split_layers(model.num_layers, plan.pp)
    for stage, (first, end) in enumerate(stage_layers):
        if stage > 0:
            last = builder.collective(
                f"pp.send_recv.stage{stage}", "send_recv", deps=(last,), stage=stage,
                message_bytes=tokens * model.hidden_size * dtype_bytes(precision.activation),
                participants=2, devices=plan.devices_per_stage)
        last = family(builder, (first, end), (last,), stage)
    logits_tokens = batch.num_requests if logits == "last" else tokens
    lm_head(builder, tokens, logits_tokens, deps=(last,), stage=plan.pp - 1)
    memory = _memory(builder, stage_layers, logits_tokens)
    return builder.build(memory)


def split_layers(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """Contiguous, as-even-as-possible split of layers into pipeline stages."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append((start, start + n - 1))
        start += n
    return out


def _memory(b: GraphBuilder, stage_layers: list[tuple[int, int]], logits_tokens: int) -> MemoryFacts:
    """Per-device bytes on the most loaded pipeline stage."""
    model, plan, batch, prec = b.model, b.plan, b.batch, b.precision
    weights_by_stage = [0.0] * plan.pp
    for t in b.tasks:
        wb = float(t.attributes.get("weight_bytes", 0.0))
        if t.attributes.get("tied_to_embedding"):
            wb = 0.0 if plan.pp == 1 else wb
        weights_by_stage[t.stage] += wb * (t.count if t.layers else 1)
    kv_fn = getattr(family_module(model.model_type), "kv_bytes_per_token_layer",
                    dense_family.kv_bytes_per_token_layer)
    kv_per_token_layer = kv_fn(b)
    max_layers = max(e - f + 1 for f, e in stage_layers)
    kv = batch.kv_tokens * kv_per_token_layer * max_layers / plan.dp
    act_b = dtype_bytes(prec.activation)
    inter_local = max(model.intermediate_size // plan.tp, 1)
    tokens = batch.tokens / plan.dp
    activations = tokens * (3 * model.hidden_size + 3 * inter_local) * act_b
    activations += logits_tokens * model.vocab_size / plan.tp * 4  # fp32 logits
    stage = max(range(plan.pp), key=lambda s: weights_by_stage[s])
    return MemoryFacts(weights=weights_by_stage[stage], kv_cache=kv, activations=activations)


def family_module(model_type: str):
    import importlib

    fn = family_for(model_type)
    return importlib.import_module(fn.__module__)
