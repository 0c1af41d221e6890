"""Generic pre-norm decoder: runs of identical layers, each attention + FFN.

A family supplies two callables: `attention(b, layers, deps, stage, kind)` and
`ffn(b, layers, deps, stage, kind)`. Layers of one kind with a constant stride are built
once and repeated (`count`), so the cost of building and resolving is independent of depth.
"""

from __future__ import annotations

from collections.abc import Callable

from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.workload.families.common import (
    norm_rows,
    residual_add,
    rms_norm,
    separate_activation_quant,
    sp_all_gather,
)
from perfcast.workload.families.traits import LayerKind, layer_runs
from perfcast.workload.graph import GraphBuilder

SUPPORTED_ACTS = {"silu", "swiglu"}

BlockFn = Callable[[GraphBuilder, tuple[int, ...], tuple[str, ...], int, LayerKind], str]


def check_activation(b: GraphBuilder) -> None:
    m = b.model
    if m.hidden_act not in SUPPORTED_ACTS:
        raise UnsupportedModelError(f"activation {m.hidden_act!r} is not modelled",
                                    source=m.source, field="hidden_act",
                                    expected=" or ".join(sorted(SUPPORTED_ACTS)))


def decoder_layer(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...], stage: int,
                  kind: LayerKind, attention: BlockFn, ffn: BlockFn) -> str:
    """Pre-norm layer. With the residual add fused across layers (stack `default`) both
    norms add the residual; with `per_layer` (TensorCast) the input norm is a plain
    RMSNorm, the post-attention norm adds the attention output, and an `aten.add` ends
    the layer."""
    h = b.model.hidden_size
    tokens = b.local_batch.tokens
    # the residual stream is replicated on the TP ranks of a DP rank, or split by tokens
    # under sequence parallelism (gathered before each block)
    rows, replicas = norm_rows(b, tokens)
    per_layer = b.stack.residual == "per_layer"
    norm1 = rms_norm(b, "attn.input_norm", rows, h, layers=layers, deps=deps, stage=stage,
                     replicas=replicas, residual=not per_layer,
                     quant_output=_norm_quantises(b, "attn.qkv_proj", kind))
    norm1 = sp_all_gather(b, "attn.sp_all_gather", tokens, h, layers=layers, deps=(norm1,),
                          stage=stage) or norm1
    attn = attention(b, layers, (norm1,), stage, kind)
    norm2 = rms_norm(b, "mlp.post_attn_norm", rows, h, layers=layers, deps=(attn,),
                     stage=stage, replicas=replicas, branch_rows=_flat_branch(b, attn),
                     quant_output=_norm_quantises(b, "mlp.gate_up_proj", kind))
    norm2 = sp_all_gather(b, "mlp.sp_all_gather", tokens, h, layers=layers, deps=(norm2,),
                          stage=stage) or norm2
    out = ffn(b, layers, (norm2,), stage, kind)
    if per_layer:
        out = residual_add(b, "mlp.residual_add", rows, h, layers=layers, deps=(out,),
                           stage=stage, replicas=replicas, branch_rows=_flat_branch(b, out))
    return out


def _norm_quantises(b: GraphBuilder, group: str, kind: LayerKind) -> bool:
    """Whether a norm quantises its output for linear `group` after it (a stack that
    quantises linear inputs in separate ops fuses that quantisation into the norm). Not
    before TensorCast's `mlapo_quant`, which takes the hidden states unquantised, nor
    before its MoE layer, whose router reads them in fp32 and whose experts quantise
    their own rows."""
    if not separate_activation_quant(b, group):
        return False
    from perfcast.workload.families import mla, moe_tensorcast

    if group == "attn.qkv_proj":
        return not (kind.mixer == "attention" and mla.MLA_FIELDS[0] in b.model.raw
                    and mla.mlapo_quantised(b))
    return not (kind.ffn == "moe" and moe_tensorcast.applies(b))


def _flat_branch(b: GraphBuilder, lineage: str) -> bool:
    """A branch output that ends in a TP all-reduce arrives as a flat [T, h] tensor; one
    that ends in a GEMM or an all-gather is viewed back to the stream's [1, T, h]."""
    task = next(t for t in reversed(b.tasks) if t.lineage == lineage)
    return task.operation == "all_reduce"


def build_layers(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...],
                 stage: int, kinds: list[LayerKind], attention: BlockFn, ffn: BlockFn,
                 grouping=layer_runs) -> str:
    """Emit layers first..last as runs of one kind (`grouping(kinds, first, last)`,
    default `layer_runs`); return the last lineage."""
    check_activation(b)
    last = entry_deps
    for kind, run in grouping(kinds, layers[0], layers[1]):
        last = (decoder_layer(b, run, last, stage, kind, attention, ffn),)
    return last[0]


def mtp_modules(b: GraphBuilder, deps: tuple[str, ...], stage: int, kind: LayerKind,
                attention: BlockFn, ffn: BlockFn, declared: int, field: str) -> str:
    """Multi-token-prediction (next-n) modules appended after the last layer, each run
    once per step over the step's tokens: embedding of the shifted tokens (shared table),
    two norms, `eh_proj` (2h -> h), one decoder layer, the final norm and the shared LM
    head. Only as many as the config declares (`field`)."""
    from perfcast.workload.families.common import lm_head_logits

    n = int(b.options.get("mtp_layers", 0))
    if n > declared:
        raise ConfigError(f"mtp_layers={n} exceeds the {declared} MTP modules the config "
                          f"declares", source=b.model.source, field=field or "mtp_layers",
                          expected=f"at most {declared}")
    m = b.model
    tokens = b.local_batch.tokens
    last = deps
    for i in range(n):
        layer = m.num_layers + i
        pre = f"mtp{i}."
        rows, replicas = norm_rows(b, tokens)
        en = rms_norm(b, pre + "enorm", rows, m.hidden_size, deps=last, residual=False,
                      stage=stage, replicas=replicas)
        hn = rms_norm(b, pre + "hnorm", rows, m.hidden_size, deps=last, residual=False,
                      stage=stage, replicas=replicas)
        cat = sp_all_gather(b, pre + "sp_all_gather", tokens, 2 * m.hidden_size,
                            deps=(en, hn), stage=stage)
        eh = b.gemm(pre + "eh_proj", tokens, m.hidden_size, 2 * m.hidden_size,
                    deps=(cat,) if cat else (en, hn), stage=stage, weight_shards=1,
                    replicas=b.plan.tp)
        out = decoder_layer(b, (layer, layer), (eh,), stage, kind, attention, ffn)
        last = (lm_head_logits(b, pre, tokens, b.local_batch.num_requests, deps=(out,),
                               stage=stage),)
    return last[0]
