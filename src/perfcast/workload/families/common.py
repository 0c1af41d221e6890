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
             weight_shards: int = 1, replicas: int = 1) -> str:
    """RMSNorm (with the residual add fused when `residual`): ~4 FLOPs per element for
    the norm plus 1 for the add; reads input (+ residual) and weight, writes output (+ sum).
    Models whose `ArchTraits.norm` is `layer` get a LayerNorm instead: ~7 FLOPs per
    element (mean, variance, normalise, scale, shift) plus 1 for the add, weight and bias."""
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
    return b.elementwise(group, operator, "norm", inputs=inputs, outputs=outputs, flops=flops,
                         layers=layers, deps=deps, weight_params=params,
                         weight_shards=weight_shards, stage=stage, count=count,
                         replicas=replicas)


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
    return b.collective(group, "all_reduce", layers=layers, deps=deps, stage=stage,
                        message_bytes=message, participants=tp)


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
    local_vocab = -(-m.vocab_size // tp)
    lin = b.elementwise("embed.lookup", "aten.embedding.default", "embedding",
                        inputs=(TensorSpec((tokens,), "int64"),), outputs=(rows,), flops=0,
                        weight_params=local_vocab * m.hidden_size, weight_shards=tp,
                        stage=stage, extra_bytes_read=rows.nbytes)
    ar = tp_all_reduce(b, "embed.all_reduce", tokens, m.hidden_size, tp, deps=(lin,), stage=stage)
    return ar or lin


def lm_head(b: GraphBuilder, tokens: int, logits_tokens: int, *, deps=(), stage: int = 0) -> str:
    """Final norm over every token, then the vocab-parallel LM head GEMM for the
    positions that need logits, then an all-gather of the logits across TP ranks."""
    return lm_head_logits(b, "final.", tokens, logits_tokens, deps=deps, stage=stage,
                          shared=b.model.tie_word_embeddings)


def lm_head_logits(b: GraphBuilder, prefix: str, tokens: int, logits_tokens: int, *, deps=(),
                   stage: int = 0, shared: bool = True) -> str:
    """Norm + vocab-parallel head + logits all-gather. `shared`: the head weight is
    counted elsewhere (tied embedding, or an MTP module sharing the main LM head)."""
    m = b.model
    tp = b.plan.tp
    rows, replicas = norm_rows(b, tokens)
    norm = rms_norm(b, prefix + "norm", rows, m.hidden_size, deps=deps, residual=True,
                    stage=stage, replicas=replicas)
    norm = sp_all_gather(b, prefix + "sp_all_gather", logits_tokens, m.hidden_size,
                         deps=(norm,), stage=stage) or norm
    local_vocab = -(-m.vocab_size // tp)
    head = b.gemm(prefix + "lm_head", logits_tokens, local_vocab, m.hidden_size, deps=(norm,),
                  weight_shards=1 if shared else tp, stage=stage,
                  extra={"tied_to_embedding": shared})
    if shared:
        b.tasks[-1] = _drop_weight_params(b.tasks[-1], keep_tied_bytes=prefix == "final.")
    if tp > 1:
        return b.collective(prefix + "logits_all_gather", "all_gather", deps=(head,),
                            stage=stage, message_bytes=logits_tokens * local_vocab * tp
                            * dtype_bytes(b.precision.activation), participants=tp)
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
