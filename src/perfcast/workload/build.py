"""Entry point of the workload layer: (model, plan, batch, precision) -> TaskGraph."""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.families import family_for
from perfcast.workload.families.common import embedding, lm_head
from perfcast.workload.fusions import apply_fusions
from perfcast.workload.graph import GraphBuilder, MemoryFacts, Precision, TaskGraph
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.plan_spec import Batch, ParallelPlan
from perfcast.workload.stacks import OpStack
from perfcast.workload.tensors import Task, TaskKind

LOGITS_MODES = ("last", "all")


def build_task_graph(model: ModelSpec, plan: ParallelPlan, batch: Batch,
                     precision: Precision | None = None, *, logits: str = "last",
                     mtp_layers: int = 0, mla_form: str = "auto", block_size: int = 0,
                     reserve_bytes: float = 0.0, training: bool = False,
                     mla_call: str = "split", stack: str | OpStack = "default") -> TaskGraph:
    """Build the exact work of one step on one representative device per stage.

    Conventions (also stored in `TaskGraph.conventions`):
    * attention is causal: a new token at position p attends to p keys (sliding window
      caps it); FLOPs = 2*heads*(qk_dim+v_dim) per (query, key) pair;
    * `logits="last"` computes the LM head for one position per request (what serving
      engines do); `"all"` for every token (training-style scoring);
    * GEMM FLOPs are 2*m*n*k; norms, RoPE and activations count a few FLOPs per element;
    * `batch` is the whole step; with attention DP (`plan.dp`) each rank computes its
      share (`Batch.per_dp_rank`), so per-device work x devices = single-device work;
    * `precision=None` reads the checkpoint's quantisation (`quant.precision_for_model`);
    * `mtp_layers`: MTP/next-n modules run once per step (at most what the config
      declares); `mla_form`: auto | naive | absorbed, `mla_call`: split | tensorcast
      (see `families.mla`);
    * `block_size` > 0 rounds each request's KV cache up to whole pages;
      `reserve_bytes`: framework reserve per device added to the memory facts;
    * `training=True` lets families emit training-only ops (the dropouts GPT configs
      declare); `perfcast.training` derives backward and optimizer work from the graph;
    * `stack`: the operator conventions of the software stack (`perfcast.workload.stacks`:
      fusion boundaries, the tensors each call receives and the fusion passes it runs);
      a name of `stacks.yaml` (`default`, `tensorcast`, `vllm-ascend-0.18`).
    """
    if logits not in LOGITS_MODES:
        raise ConfigError(f"unknown logits mode {logits!r}", field="logits",
                          expected=" | ".join(LOGITS_MODES))
    if plan.pp > model.num_layers:
        raise ConfigError(f"pp_size={plan.pp} exceeds num_hidden_layers={model.num_layers}",
                          field="pp_size", expected="at most the number of layers")
    if mtp_layers < 0 or block_size < 0 or reserve_bytes < 0:
        raise ConfigError("mtp_layers, block_size and reserve_bytes must be >= 0",
                          field="mtp_layers/block_size/reserve_bytes", expected=">= 0")
    if precision is None:
        from perfcast.workload.quant import precision_for_model

        precision = precision_for_model(model)
    family = family_for(model.model_type, model.source)
    builder = GraphBuilder(model, plan, batch, precision,
                           options={"mtp_layers": mtp_layers, "mla_form": mla_form,
                                    "training": training, "mla_call": mla_call,
                                    "stack": stack})
    builder.conventions.update({
        "attention": "causal; FLOPs = 2*heads*(qk_dim+v_dim) per attended (query,key) pair",
        "logits": logits,
        "gemm_flops": "2*m*n*k",
        "work_scope": "per device per call; totals multiply by count and devices",
        "attention_dp": "each DP rank computes ceil(requests/dp) of every batch segment",
        "moe_dispatch": plan.moe_dispatch_mode,
        "moe_routing": "uniform over experts; busiest EP rank x expert_imbalance",
        "stack": builder.stack.name,
    })
    if mtp_layers:
        builder.conventions["mtp_layers"] = str(mtp_layers)
    local = builder.local_batch
    tokens = local.tokens
    last = embedding(builder, tokens, stage=0)
    stage_layers = split_layers(model.num_layers, plan.pp)
    for stage, (first, end) in enumerate(stage_layers):
        if stage > 0:
            last = builder.collective(
                f"pp.send_recv.stage{stage}", "send_recv", deps=(last,), stage=stage,
                message_bytes=(-(-tokens // plan.tp) if plan.sp else tokens)
                * model.hidden_size * dtype_bytes(precision.activation),
                participants=2, devices=plan.devices_per_stage)
        last = family(builder, (first, end), (last,), stage)
    logits_tokens = local.num_requests if logits == "last" else tokens
    lm_head(builder, tokens, logits_tokens, deps=(last,), stage=plan.pp - 1)
    memory = memory_facts(builder.tasks, plan, block_size=block_size,
                          reserve_bytes=reserve_bytes, residual_bytes=tokens * model.hidden_size
                          * dtype_bytes(precision.activation))
    memory = replace(memory, activations_per_token=memory.activations / tokens)
    if builder.stack.fusions:  # the stack's fusion passes; memory is the unfused graph's
        builder.tasks = apply_fusions(builder.tasks, builder.stack.fusions)
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


# operation -> the inputs that are activations when the call also receives resident
# tensors: the paged cache `reshape_and_cache` / `concat_and_cache_mla` write into, the
# embedding or RoPE table, the weights TensorCast's `mlapo` takes after hidden, cos, sin,
# the latent cache and indices TensorCast's sparse MLA call takes after q
RESIDENT_INPUTS = {"kv_cache_write": slice(0, 2), "embedding": slice(-1, None),
                   "table_gather": slice(0, 0), "mlapo": slice(0, 3),
                   "mla_sparse_attention": slice(0, 1)}


def _activation_bytes(t: Task) -> float:
    """Live activation bytes while `t` runs: outputs plus inputs that are neither weights
    nor the KV cache (`RESIDENT_INPUTS` for calls that also receive those)."""
    if t.kind is not TaskKind.COMPUTE:
        return 0.0
    out = sum(x.nbytes for x in t.outputs)
    rest_is_weight_or_cache = (t.operation in ("moe", "attention", "mla_attention")
                               or (t.operation == "gemm" and "weight_params" in t.attributes))
    ins = t.inputs[:1] if rest_is_weight_or_cache else t.inputs
    if t.operation in RESIDENT_INPUTS:
        ins = ins[RESIDENT_INPUTS[t.operation]]
    return out + sum(x.nbytes for x in ins)


def memory_facts(tasks: list[Task], plan: ParallelPlan, *, block_size: int = 0,
                 reserve_bytes: float = 0.0, residual_bytes: float = 0.0) -> MemoryFacts:
    """Per-device bytes on the most loaded pipeline stage, read off the tasks:
    weights from `weight_bytes` (once per layer), KV cache from each attention task's
    `kv_cache_bytes_per_token` over its requests' cached tokens (window-capped) plus any
    task's fixed `state_bytes_per_request` (recurrent state; requests from the
    `requests` attribute or the `batch` axis), and the
    activation peak as the largest op's live tensors plus the residual stream."""
    pp = plan.pp
    weights = [0.0] * pp
    kv = [0.0] * pp
    act = [0.0] * pp
    per_token: list[dict[int, float]] = [{} for _ in range(pp)]
    state_per_request = [0.0] * pp
    seen_runs: set[tuple] = set()
    for t in tasks:
        a = t.attributes
        wb = float(a.get("weight_bytes", 0.0))
        if pp > 1 and a.get("tied_weight_bytes") and t.stage > 0:
            wb = float(a["tied_weight_bytes"])  # the last stage holds its own copy
        weights[t.stage] += wb * int(a.get("layer_count", t.count))
        act[t.stage] = max(act[t.stage], _activation_bytes(t))
        state = a.get("state_bytes_per_request")
        if state is not None:  # fixed-size per-request state (e.g. recurrent layers)
            requests = int(a.get("requests", t.work.axes.get("batch", 0)))
            kv[t.stage] += requests * float(state) * t.count
            run = (t.layers, t.stage, t.lineage.split(".", 1)[0], "state")
            if run not in seen_runs:
                seen_runs.add(run)
                state_per_request[t.stage] += float(state) * t.count
        per_tok = a.get("kv_cache_bytes_per_token")
        if per_tok is None:
            continue
        window = int(a.get("cache_window", 0))
        layers = t.count
        axes = t.work.axes
        requests, cached = int(axes["batch"]), int(axes["kv_len"])
        tokens = min(cached, window) if window else cached
        if block_size:
            tokens = -(-tokens // block_size) * block_size
        kv[t.stage] += requests * tokens * float(per_tok) * layers
        # one entry per layer run and cache (a layer may hold several, e.g. the DSA
        # indexer's keys beside the MLA latent: `cache_name`), not per batch segment
        run = (t.layers, t.stage, t.lineage.split(".", 1)[0], str(a.get("cache_name", "")))
        if run not in seen_runs:
            seen_runs.add(run)
            per_token[t.stage][window] = per_token[t.stage].get(window, 0.0) \
                + float(per_tok) * layers
    totals = [weights[s] + kv[s] + act[s] for s in range(pp)]
    s = max(range(pp), key=lambda i: totals[i])
    return MemoryFacts(weights=weights[s], kv_cache=kv[s], activations=act[s] + residual_bytes,
                       reserve=reserve_bytes,
                       kv_bytes_per_token=tuple(sorted(per_token[s].items())),
                       dp_ranks=plan.dp, block_size=block_size,
                       state_bytes_per_request=state_per_request[s])
