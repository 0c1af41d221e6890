"""Pieces shared by model families: norms, embedding, LM head, TP helpers."""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec


def check_divisible(value: int, by: int, what: str, constraint: str) -> int:
    if by <= 0 or value % by:
        raise ConfigError(f"{what}={value} is not divisible by {constraint}={by}",
                          field=constraint.split(" ")[0], expected=f"a divisor of {value}")
    return value // by


def positive_int_field(model, key: str, what: str) -> int:
    """`model.raw[key]` as a positive integer, else a ConfigError naming the field and
    what needs it (`what`, e.g. "multi-head latent attention")."""
    value = model.raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError("is missing or not a positive integer" if value is None
                          else f"has value {value!r}", source=model.source, field=key,
                          expected=f"a positive integer for {what}")
    return value


def rms_norm(b: GraphBuilder, group: str, tokens: int, width: int, *, layers=None, deps=(),
             residual: bool = True, stage: int = 0, count: int | None = None,
             weight_shards: int = 1, replicas: int = 1, quant_output: bool = False,
             branch_rows: bool = False) -> str:
    """RMSNorm (with the residual add fused when `residual`): ~4 FLOPs per element for
    the norm plus 1 for the add; reads input (+ residual) and weight, writes output (+ sum).
    Models whose `ArchTraits.norm` is `layer` get a LayerNorm instead: ~7 FLOPs per
    element (mean, variance, normalise, scale, shift) plus 1 for the add, weight and bias.

    Under a stack whose residual add is not fused across layers (`per_layer`), the
    residual norm is TensorCast's `add_rms_norm2` (sum and normed output) and the layer
    ends with `residual_add`. `quant_output` (stacks that quantise activations in
    separate ops, W8A8): the norm also quantises its output to int8 with a dynamic
    per-token scale (`*_dynamic_quant*_symmetric`). `branch_rows`: the branch output
    added to the residual arrives as a flat [T, h] tensor (after a TP collective)."""
    from perfcast.workload.families.traits import traits_for

    act = b.precision.activation
    layer = traits_for(b.model).norm == "layer"
    params = 2 * width if layer else width
    x = TensorSpec((tokens, width), act)
    gamma = TensorSpec((params,), act)  # the norm weight is an input, as in the kernel call
    inputs = (x, x, gamma) if residual else (x, gamma)
    outputs = (x, x) if residual else (x,)
    kind = "layer_norm" if layer else "rms_norm"
    operator = f"tensor_cast.add_{kind}.default" if residual else f"tensor_cast.{kind}.default"
    flops = tokens * width * ((7 if layer else 4) + (1 if residual else 0))
    signature = None
    if b.stack.tensorcast_tensors and not layer:
        stream = TensorSpec((1, tokens, width), act)
        branch = x if branch_rows else stream
        ins = (stream, branch, gamma) if residual else (stream, gamma)
        outs = (stream, stream) if residual else (stream,)
        if residual and b.stack.residual == "per_layer":
            operator = "tensor_cast.add_rms_norm2.default"
        if quant_output:
            q = TensorSpec((1, tokens, width), "int8")
            outs = (q, TensorSpec((), "fp32")) + ((stream,) if residual else ())
            operator = ("tensor_cast.add_rms_norm_dynamic_quant2_symmetric.default" if residual
                        else "tensor_cast.rms_norm_dynamic_quant_symmetric.default")
            outputs = (TensorSpec((tokens, width), "int8"),) + ((x,) if residual else ())
        signature = (ins, outs)
    return b.elementwise(group, operator, "norm", inputs=inputs, outputs=outputs, flops=flops,
                         layers=layers, deps=deps, weight_params=params,
                         weight_shards=weight_shards, stage=stage, count=count,
                         replicas=replicas, signature=signature)


def residual_add(b: GraphBuilder, group: str, tokens: int, width: int, *, layers=None,
                 deps=(), stage: int = 0, replicas: int = 1, branch_rows: bool = False) -> str:
    """The residual add that ends a layer when the stack does not fuse it into the next
    layer's norm (`aten.add.Tensor`, 1 FLOP per element)."""
    act = b.precision.activation
    x = TensorSpec((tokens, width), act)
    stream = TensorSpec((1, tokens, width), act)
    return b.elementwise(group, "aten.add.Tensor", "residual_add", inputs=(x, x),
                         outputs=(x,), flops=tokens * width, layers=layers, deps=deps,
                         stage=stage, replicas=replicas,
                         signature=((stream, x if branch_rows else stream), (stream,)))


def dynamic_quantize(b: GraphBuilder, group: str, rows: int, width: int, *, layers=None,
                     deps=(), stage: int = 0, stream: bool = False,
                     view: tuple[int, ...] | None = None, count: int | None = None) -> str:
    """Per-token dynamic int8 quantisation of a linear's input, when the stack runs it as
    its own op (`tensor_cast.dynamic_quantize_symmetric`): reads the activation, writes
    int8 and a scale; ~3 FLOPs per element (abs-max, scale, round). `stream`: the input
    is the [1, T, w] view (the MLP intermediate) rather than a flat [T, w] tensor;
    `view`: another shape of the same elements as the call receives it (MLA's
    (T, heads, v_head_dim) attention output)."""
    act = b.precision.activation
    x = TensorSpec((rows, width), act)
    shape = view or ((1, rows, width) if stream else (rows, width))
    return b.elementwise(group, "tensor_cast.dynamic_quantize_symmetric.default", "quantize",
                         inputs=(x,), outputs=(TensorSpec((rows, width), "int8"),),
                         flops=3 * rows * width, layers=layers, deps=deps, stage=stage,
                         count=count,
                         signature=((TensorSpec(shape, act),),
                                    (TensorSpec(shape, "int8"), TensorSpec((), "fp32"))))


def separate_activation_quant(b: GraphBuilder, group: str) -> bool:
    """True when the stack quantises the input of linear `group` in its own op (W8A8)."""
    if b.stack.activation_quant != "separate":
        return False
    return b.precision.linear(group)[1] == "int8"


def rope_tables(b: GraphBuilder, stage: int, rotary_dim: int) -> tuple[str, ...]:
    """The cos and sin rows of this step's positions, gathered once per step and stage
    from caches of `max_position_embeddings` rows when the stack does so (`gathered`);
    () when the RoPE kernel reads its tables itself."""
    if b.stack.rope_tables != "gathered":
        return ()
    key = ("rope_tables", stage)
    if key in b.step_tasks:
        return b.step_tasks[key]
    act = b.precision.activation
    tokens = b.local_batch.tokens
    positions = int(b.model.raw.get("max_position_embeddings") or 0)
    if positions <= 0:
        raise ConfigError("is missing", source=b.model.source, field="max_position_embeddings",
                          expected="a positive integer (the RoPE cache rows the stack gathers)")
    rows = TensorSpec((tokens, rotary_dim), act)
    table = TensorSpec((positions, rotary_dim), act)
    ids = TensorSpec((tokens,), "int64")
    suffix = f".stage{stage}" if stage else ""   # one lineage per pipeline stage
    out = tuple(b.elementwise(
        f"rope.{name}_gather{suffix}", "aten.index.Tensor", "table_gather", inputs=(rows, ids),
        outputs=(rows,), flops=0, stage=stage, signature=((table, ids), (rows,)),
        extra={"list_inputs": 1})
        for name in ("cos", "sin"))
    b.step_tasks[key] = out
    return out


def sequence_parallel(b: GraphBuilder) -> bool:
    """Sequence parallelism: between blocks each TP rank holds 1/tp of the tokens."""
    return b.plan.sp and b.plan.tp > 1


def norm_rows(b: GraphBuilder, tokens: int) -> tuple[int, int]:
    """(rows, replicas) of a residual-stream op: all tokens on every TP rank (replicated
    work), or a 1/tp slice of them under sequence parallelism."""
    tp = b.plan.tp
    if sequence_parallel(b):
        return -(-tokens // tp), 1
    return tokens, tp


def tp_all_reduce(b: GraphBuilder, group: str, tokens: int, width: int, tp: int, *, layers=None,
                  deps=(), stage: int = 0) -> str | None:
    """Sum the TP partial outputs: an all-reduce, or under sequence parallelism a
    reduce-scatter that leaves each rank its slice of tokens (`*.reduce_scatter`)."""
    if tp <= 1:
        return None
    message = tokens * width * dtype_bytes(b.precision.activation)
    if sequence_parallel(b):
        return b.collective(group.rsplit(".", 1)[0] + ".reduce_scatter", "reduce_scatter",
                            layers=layers, deps=deps, stage=stage, message_bytes=message,
                            participants=tp)
    shapes = ((tokens, width), (tokens, width)) if b.stack.tensorcast_tensors else None
    return b.collective(group, "all_reduce", layers=layers, deps=deps, stage=stage,
                        message_bytes=message, participants=tp, shapes=shapes)


def sp_all_gather(b: GraphBuilder, group: str, tokens: int, width: int, *, layers=None,
                  deps=(), stage: int = 0) -> str | None:
    """Under sequence parallelism, gather the token slices before a TP block."""
    if not sequence_parallel(b):
        return None
    return b.collective(group, "all_gather", layers=layers, deps=deps, stage=stage,
                        message_bytes=tokens * width * dtype_bytes(b.precision.activation),
                        participants=b.plan.tp)


def embedding(b: GraphBuilder, tokens: int, *, stage: int = 0) -> str:
    """Vocab-parallel embedding lookup: reads one row per token, no FLOPs; TP ranks
    all-reduce the partial rows."""
    m = b.model
    tp = b.plan.tp
    act = b.precision.activation
    rows = TensorSpec((tokens, m.hidden_size), act)
    shards = tp if b.stack.embedding == "vocab_parallel" else 1
    local_vocab = -(-m.vocab_size // shards)
    ids = TensorSpec((tokens,), "int64")
    signature = None
    if b.stack.tensorcast_tensors:
        signature = ((TensorSpec((local_vocab, m.hidden_size), act),
                      TensorSpec((1, tokens), "int64")),
                     (TensorSpec((1, tokens, m.hidden_size), act),))
    lin = b.elementwise("embed.lookup", "aten.embedding.default", "embedding",
                        inputs=(ids,), outputs=(rows,), flops=0,
                        weight_params=local_vocab * m.hidden_size, weight_shards=shards,
                        stage=stage, extra_bytes_read=rows.nbytes, signature=signature,
                        replicas=tp // shards)
    ar = tp_all_reduce(b, "embed.all_reduce", tokens, m.hidden_size, shards, deps=(lin,),
                       stage=stage)
    return ar or lin


def lm_head(b: GraphBuilder, tokens: int, logits_tokens: int, *, deps=(), stage: int = 0) -> str:
    """Final norm over every token, then the vocab-parallel LM head GEMM for the
    positions that need logits, then an all-gather of the logits across TP ranks."""
    return lm_head_logits(b, "final.", tokens, logits_tokens, deps=deps, stage=stage,
                          shared=b.model.tie_word_embeddings)


def lm_head_logits(b: GraphBuilder, prefix: str, tokens: int, logits_tokens: int, *, deps=(),
                   stage: int = 0, shared: bool = True) -> str:
    """Norm + vocab-parallel head + logits all-gather. `shared`: the head weight is
    counted elsewhere (tied embedding, or an MTP module sharing the main LM head).
    Under a stack that gathers the logit positions (`logits_gather`), an
    `aten.index.Tensor` picks them from the normed rows before the head."""
    m = b.model
    tp = b.plan.tp
    rows, replicas = norm_rows(b, tokens)
    from perfcast.workload.families.traits import traits_for

    fused = b.stack.residual == "fused" or traits_for(m).norm == "layer"
    norm = rms_norm(b, prefix + "norm", rows, m.hidden_size, deps=deps, residual=fused,
                    stage=stage, replicas=replicas)
    norm = sp_all_gather(b, prefix + "sp_all_gather", logits_tokens, m.hidden_size,
                         deps=(norm,), stage=stage) or norm
    act = b.precision.activation
    if b.stack.logits_gather and logits_tokens < tokens:
        picked = TensorSpec((logits_tokens, m.hidden_size), act)
        norm = b.elementwise(
            prefix + "logits_gather", "aten.index.Tensor", "gather",
            inputs=(picked, TensorSpec((logits_tokens,), "int64")), outputs=(picked,), flops=0,
            deps=(norm,), stage=stage, extra={"list_inputs": 1},
            signature=((TensorSpec((1, tokens, m.hidden_size), act),
                        TensorSpec((logits_tokens,), "int64")),
                       (TensorSpec((1, logits_tokens, m.hidden_size), act),)))
    local_vocab = -(-m.vocab_size // tp)
    head = b.gemm(prefix + "lm_head", logits_tokens, local_vocab, m.hidden_size, deps=(norm,),
                  weight_shards=1 if shared else tp, stage=stage,
                  extra={"tied_to_embedding": shared})
    if shared:
        b.tasks[-1] = _drop_weight_params(b.tasks[-1], keep_tied_bytes=prefix == "final.")
    if tp > 1:
        shapes = (((1, logits_tokens, local_vocab), (1, logits_tokens, local_vocab * tp))
                  if b.stack.tensorcast_tensors else None)
        return b.collective(prefix + "logits_all_gather", "all_gather", deps=(head,),
                            stage=stage, message_bytes=logits_tokens * local_vocab * tp
                            * dtype_bytes(act), participants=tp, shapes=shapes)
    return head


def _drop_weight_params(task, *, keep_tied_bytes: bool):
    """The head weight is counted elsewhere. A tied final head keeps its bytes under
    `tied_weight_bytes`: with PP > 1 the last stage holds its own copy."""
    from dataclasses import replace

    from perfcast.core.frozen import FrozenDict

    attrs = dict(task.attributes)
    if keep_tied_bytes:
        attrs["tied_weight_bytes"] = attrs.get("weight_bytes", 0.0)
    attrs["weight_params"] = 0
    attrs["weight_bytes"] = 0.0
    return replace(task, attributes=FrozenDict(attrs))
