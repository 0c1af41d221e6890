"""GPT-style decoders: `gpt2`, `gpt_neox`, `gpt_bigcode`.

Pre-LayerNorm blocks of multi-head attention (GPT-BigCode: multi-query when the config
says `multi_query`) and a GeLU MLP (`intermediate_size`, 4 x hidden by default), biases
on every linear. Positions are learned (`gpt2`, `gpt_bigcode`: a `max_position_embeddings`
x hidden table added after the token embedding) or rotary (`gpt_neox`: RoPE on
`rotary_pct` of each head; the RoPE op is costed on whole heads, a few FLOPs per element).
`gpt_neox` with `use_parallel_residual` (the default) computes attention and MLP from the
same layer input: x + attn(ln1(x)) + mlp(ln2(x)).

With `GraphBuilder.options["training"]` the residual dropouts the config declares
(`resid_pdrop` / `embd_pdrop`, `hidden_dropout`) are emitted as `*.dropout` ops (their
1-byte masks are saved for the backward pass); inference graphs have none.
"""

from __future__ import annotations

from perfcast.core.errors import UnsupportedModelError
from perfcast.workload.families.attention import gqa_attention
from perfcast.workload.families.common import (
    check_divisible,
    norm_rows,
    rms_norm,
    sp_all_gather,
    tp_all_reduce,
)
from perfcast.workload.families.traits import traits_for
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec

GELU_ACTS = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python"}
LEARNED_POSITIONS = {"gpt2", "gpt_bigcode"}
# config keys of the residual (block output) and embedding dropout, first present wins
RESID_DROPOUT_KEYS = ("resid_pdrop", "hidden_dropout")
EMBED_DROPOUT_KEYS = ("embd_pdrop", "hidden_dropout")
ATTN_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout")


def dropout_p(model, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = model.raw.get(key)
        if value is not None:
            return float(value)
    return 0.0


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    """Emit GPT layers first..last (one repeated run); return the last lineage."""
    m = b.model
    if m.hidden_act not in GELU_ACTS:
        raise UnsupportedModelError(f"activation {m.hidden_act!r} is not modelled",
                                    source=m.source, field="hidden_act",
                                    expected=" or ".join(sorted(GELU_ACTS)))
    training = bool(b.options.get("training"))
    h = m.hidden_size
    tokens = b.local_batch.tokens
    last = entry_deps
    if layers[0] == 0:
        last = (embedding_extras(b, last, stage, training),)
    run = (layers[0], layers[1], 1)
    rows, replicas = norm_rows(b, tokens)
    resid_p = dropout_p(m, RESID_DROPOUT_KEYS) if training else 0.0
    parallel = m.model_type == "gpt_neox" and bool(m.raw.get("use_parallel_residual", True))
    norm1 = rms_norm(b, "attn.input_norm", rows, h, layers=run, deps=last, stage=stage,
                     replicas=replicas)
    gathered = sp_all_gather(b, "attn.sp_all_gather", tokens, h, layers=run, deps=(norm1,),
                             stage=stage) or norm1
    attn = gqa_attention(b, run, (gathered,), stage, window=None, traits=traits_for(m),
                         rope=m.model_type not in LEARNED_POSITIONS)
    if resid_p:
        attn = dropout(b, "attn.dropout", rows, h, layers=run, deps=(attn,), stage=stage,
                       replicas=replicas)
    norm2 = rms_norm(b, "mlp.post_attn_norm", rows, h, layers=run,
                     deps=last if parallel else (attn,), stage=stage, replicas=replicas)
    norm2 = sp_all_gather(b, "mlp.sp_all_gather", tokens, h, layers=run, deps=(norm2,),
                          stage=stage) or norm2
    out = gelu_mlp(b, run, (norm2,), stage, inter=m.intermediate_size)
    if resid_p:
        out = dropout(b, "mlp.dropout", rows, h, layers=run, deps=(out,), stage=stage,
                      replicas=replicas)
    if parallel:  # x + attn + mlp: one more add of the attention branch
        out = b.elementwise("mlp.parallel_residual_add", "aten.add.Tensor", "add",
                            inputs=(TensorSpec((rows, h), b.precision.activation),) * 2,
                            outputs=(TensorSpec((rows, h), b.precision.activation),),
                            flops=rows * h, layers=run, deps=(out, attn), stage=stage,
                            replicas=replicas)
    return out


def embedding_extras(b: GraphBuilder, deps: tuple[str, ...], stage: int, training: bool) -> str:
    """Learned position embedding (added to the token rows; the table is replicated on
    the TP ranks) and, in training, the embedding dropout."""
    m = b.model
    h = m.hidden_size
    rows, replicas = norm_rows(b, b.local_batch.tokens)
    act = b.precision.activation
    x = TensorSpec((rows, h), act)
    last = deps[0] if deps else ""
    if m.model_type in LEARNED_POSITIONS:
        positions = int(m.raw.get("max_position_embeddings") or 0)
        if positions < 1:
            raise UnsupportedModelError("is missing for learned positions", source=m.source,
                                        field="n_positions", expected="a positive integer")
        last = b.elementwise("embed.position_add", "aten.add.Tensor", "add", inputs=(x,),
                             outputs=(x,), flops=rows * h, deps=deps, stage=stage,
                             weight_params=positions * h, weight_shards=1, replicas=replicas,
                             extra_bytes_read=x.nbytes)
        deps = (last,)
    p = dropout_p(m, EMBED_DROPOUT_KEYS) if training else 0.0
    if p:
        last = dropout(b, "embed.dropout", rows, h, deps=deps, stage=stage, replicas=replicas)
    return last or deps[0]


def dropout(b: GraphBuilder, group: str, rows: int, width: int, *, layers=None, deps=(),
            stage: int = 0, replicas: int = 1) -> str:
    """Dropout: a random draw, compare and scale per element; writes the output and a
    1-byte mask (kept for the backward pass)."""
    act = b.precision.activation
    x = TensorSpec((rows, width), act)
    return b.elementwise(group, "aten.native_dropout.default", "dropout", inputs=(x,),
                         outputs=(x, TensorSpec((rows, width), "bool")), flops=3 * rows * width,
                         layers=layers, deps=deps, stage=stage, replicas=replicas)


def gelu_mlp(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...], stage: int, *,
             inter: int) -> str:
    """Column-parallel fc_in (h -> inter), GeLU (~8 FLOPs per element, tanh form),
    row-parallel fc_out (inter -> h), then the TP all-reduce (or reduce-scatter under SP).
    Both linears carry biases."""
    m = b.model
    tp = b.plan.tp
    inter_l = check_divisible(inter, tp, "intermediate_size", "tp_size")
    tokens = b.local_batch.tokens
    act = b.precision.activation
    up = b.gemm("mlp.up_proj", tokens, inter_l, m.hidden_size, layers=layers, deps=deps,
                weight_shards=tp, stage=stage, extra={"bias_params": inter_l})
    y = TensorSpec((tokens, inter_l), act)
    gelu = b.elementwise("mlp.act", "tensor_cast.gelu.default", "activation", inputs=(y,),
                         outputs=(y,), flops=8 * tokens * inter_l, layers=layers, deps=(up,),
                         stage=stage)
    down = b.gemm("mlp.down_proj", tokens, m.hidden_size, inter_l, layers=layers, deps=(gelu,),
                  weight_shards=tp, stage=stage, extra={"bias_params": m.hidden_size})
    return tp_all_reduce(b, "mlp.all_reduce", tokens, m.hidden_size, tp, layers=layers,
                         deps=(down,), stage=stage) or down
