"""Published training measurements and the FLOP conventions their papers count with.

A published "TFLOP/s per GPU" is F / (iteration time x GPUs) with the paper's own F. To
compare a prediction with it, the predicted step time is converted with the same F
(`predicted_tflops_per_gpu`); equivalently the published figure implies a step time
(`implied_step_time_s`). The rows live in a YAML file (benchmarks/data/
training_published.yaml) that cites each one; nothing in perfcast is fitted to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from perfcast.core.errors import ConfigError

GROUPS = ("validation", "held_out")
# layout fields a row may assume where its source is silent
ASSUMABLE = frozenset({"virtual_pipeline", "micro_batch", "recompute", "sequence_parallel",
                       "zero_stage"})
RECOMPUTE = ("none", "selective", "full")
ATTENTION_KERNELS = ("flash", "unfused")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions a paper gives. `family`: gpt (MHA, GeLU MLP of ffn_hidden, tied
    embeddings, learned positions) or llama (GQA, SwiGLU MLP, untied embeddings, RoPE)."""

    family: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_length: int
    kv_heads: int | None = None
    hf_id: str | None = None
    params_b: float | None = None
    tied_embeddings: bool | None = None   # None: the family's default (gpt tied, llama not)
    dropout: float = 0.0                  # hidden and attention dropout probability

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def gated(self) -> bool:
        return self.family == "llama"

    @property
    def tied(self) -> bool:
        return self.family == "gpt" if self.tied_embeddings is None else self.tied_embeddings


@dataclass(frozen=True)
class PublishedLayout:
    """None where the source does not say."""

    tp: int
    pp: int
    dp: int
    cp: int
    global_batch: int                 # sequences per iteration
    virtual_pipeline: int | None = None
    micro_batch: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    zero_stage: int | None = None
    overlap_grad_reduce: bool | None = None
    attention_kernel: str | None = None    # flash | unfused
    tp_comm_overlap: bool | None = None
    overlap_param_gather: bool | None = None  # ZeRO-1/2 parameter all-gather under the forward
    # the embedding / the loss take a layer slot in the pipeline split (Megatron-LM
    # --account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split)
    account_for_embedding_in_pipeline_split: bool | None = None
    account_for_loss_in_pipeline_split: bool | None = None
    # weight gradients accumulated inside the wgrad GEMMs (Megatron-LM since 2022-02);
    # false: autograd's in-place add per microbatch (see TrainingRequest)
    gradient_accumulation_fusion: bool | None = None

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


@dataclass(frozen=True)
class PublishedRun:
    id: str
    group: str                        # validation | held_out
    source: Mapping[str, str]
    row: str
    verified: bool
    verified_from: tuple[str, ...]
    model: ModelShape
    gpus: int
    device: str
    precision: str
    layout: PublishedLayout
    published: Mapping[str, float]
    flop_convention: str
    unverified: str = ""
    notes: str = ""
    # what the benchmark uses where the source is silent (virtual_pipeline, micro_batch,
    # ...), and `why`
    assumed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_iteration(self) -> int:
        return self.layout.global_batch * self.model.seq_length


@dataclass(frozen=True)
class PublishedSet:
    source: str
    runs: tuple[PublishedRun, ...]
    conventions: Mapping[str, str] = field(default_factory=dict)

    def group(self, name: str) -> tuple[PublishedRun, ...]:
        return tuple(r for r in self.runs if r.group == name)


# ---- FLOP conventions ---------------------------------------------------------------

def megatron_2021_recompute_flops(m: ModelShape, batch: int) -> float:
    """Narayanan et al. 2021, section 5.1: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per
    iteration, i.e. forward + backward + the recomputed forward of full activation
    recompute (the logit layer is not recomputed)."""
    b, s, l, h, v = batch, m.seq_length, m.layers, m.hidden, m.vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def megatron_core_model_flops(m: ModelShape, batch: int) -> float:
    """Megatron-LM `num_floating_point_operations` (megatron/training/training.py at commit
    f2e5db402c): 12 B s l h^2 ((1 + g/n + s/h) (n d)/h + (f/h) x gated + V/(2 l h)); model
    FLOPs without recompute, attention without the causal half, gated = 3/2 for SwiGLU."""
    b, s, l, h, v = batch, m.seq_length, m.layers, m.hidden, m.vocab
    n, g = m.heads, m.num_kv_heads
    q_ratio = n * m.head_dim / h
    gated = 1.5 if m.gated else 1.0
    return 12.0 * b * s * l * h * h * ((1 + g / n + s / h) * q_ratio
                                       + (m.ffn_hidden / h) * gated + v / (2 * l * h))


def parameter_count(m: ModelShape) -> int:
    """Weights, embeddings and the small vectors: GPT adds per layer QKV/projection/MLP
    biases and two LayerNorms (13 h) and learned positions (s h); llama two RMSNorms (2 h)."""
    h, d = m.hidden, m.head_dim
    attn = h * m.heads * d * 2 + h * m.num_kv_heads * d * 2
    mlp = h * m.ffn_hidden * (3 if m.gated else 2)
    small = 2 * h if m.gated else 9 * h + m.ffn_hidden   # norms (+ biases: 3h + h + f + h)
    embed = m.vocab * h * (1 if m.tied else 2) + (0 if m.gated else m.seq_length * h)
    return m.layers * (attn + mlp + small) + embed


def palm_model_flops(m: ModelShape, batch: int) -> float:
    """Chowdhery et al. 2022 (PaLM), appendix B, cited by Llama 3 for MFU:
    (6 N + 12 L H Q T) per token, attention counted without the causal half."""
    per_token = 6.0 * parameter_count(m) + 12.0 * m.layers * m.heads * m.head_dim * m.seq_length
    return per_token * batch * m.seq_length


def palm_model_causal_flops(m: ModelShape, batch: int) -> float:
    """The PaLM count with the attention term halved for the causal mask (6 N + 6 L H Q T):
    not a convention any row cites; the benchmark's sensitivity check for Llama 3, whose
    paper does not print its FLOP count."""
    per_token = 6.0 * parameter_count(m) + 6.0 * m.layers * m.heads * m.head_dim * m.seq_length
    return per_token * batch * m.seq_length


FLOP_CONVENTIONS: dict[str, Callable[[ModelShape, int], float]] = {
    "megatron_2021_recompute": megatron_2021_recompute_flops,
    "megatron_core_model": megatron_core_model_flops,
    "palm_model": palm_model_flops,
}


def convention_flops(run: PublishedRun) -> float:
    """FLOPs of one iteration of the run as its paper counts them."""
    return FLOP_CONVENTIONS[run.flop_convention](run.model, run.layout.global_batch)


def implied_step_time_s(run: PublishedRun) -> float:
    """The iteration time the published figure stands for: the source's own step time, or
    F / (GPUs x TFLOP/s per GPU) with the paper's F."""
    if "step_time_s" in run.published:
        return float(run.published["step_time_s"])
    return convention_flops(run) / (run.gpus * run.published["tflops_per_gpu"] * 1e12)


def published_tflops_per_gpu(run: PublishedRun) -> float:
    if "tflops_per_gpu" in run.published:
        return float(run.published["tflops_per_gpu"])
    return convention_flops(run) / (run.gpus * implied_step_time_s(run) * 1e12)


def predicted_tflops_per_gpu(run: PublishedRun, step_time_s: float) -> float:
    """A predicted step time in the paper's convention."""
    return convention_flops(run) / (run.gpus * step_time_s * 1e12)


# ---- loading ------------------------------------------------------------------------

def _get(d: Mapping, key: str, kind: type, source: str, where: str, *,
         optional: bool = False) -> Any:
    value = d.get(key)
    if value is None:
        if optional:
            return None
        raise ConfigError("is missing", source=source, field=f"{where}.{key}")
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ConfigError(f"has value {value!r}", source=source, field=f"{where}.{key}",
                          expected=f"a {kind.__name__}")
    return float(value) if kind is float else value


def _shape(d: Any, source: str, where: str) -> ModelShape:
    if not isinstance(d, Mapping):
        raise ConfigError("is not a mapping", source=source, field=where)
    ints = {k: _get(d, k, int, source, where)
            for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_length")}
    family = _get(d, "family", str, source, where)
    if family not in ("gpt", "llama"):
        raise ConfigError(f"has value {family!r}", source=source, field=f"{where}.family",
                          expected="gpt | llama")
    if ints["hidden"] % ints["heads"]:
        raise ConfigError(f"hidden {ints['hidden']} is not a multiple of heads {ints['heads']}",
                          source=source, field=where)
    return ModelShape(family=family, **ints,
                      kv_heads=_get(d, "kv_heads", int, source, where, optional=True),
                      hf_id=_get(d, "hf_id", str, source, where, optional=True),
                      params_b=_get(d, "params_b", float, source, where, optional=True),
                      tied_embeddings=_get(d, "tied_embeddings", bool, source, where,
                                           optional=True),
                      dropout=_get(d, "dropout", float, source, where, optional=True) or 0.0)


def _layout(d: Any, source: str, where: str) -> PublishedLayout:
    if not isinstance(d, Mapping):
        raise ConfigError("is not a mapping", source=source, field=where)
    lay = PublishedLayout(
        **{k: _get(d, k, int, source, where) for k in ("tp", "pp", "dp", "cp", "global_batch")},
        virtual_pipeline=_get(d, "virtual_pipeline", int, source, where, optional=True),
        micro_batch=_get(d, "micro_batch", int, source, where, optional=True),
        recompute=_get(d, "recompute", str, source, where, optional=True),
        sequence_parallel=_get(d, "sequence_parallel", bool, source, where, optional=True),
        zero_stage=_get(d, "zero_stage", int, source, where, optional=True),
        overlap_grad_reduce=_get(d, "overlap_grad_reduce", bool, source, where, optional=True),
        attention_kernel=_get(d, "attention_kernel", str, source, where, optional=True),
        tp_comm_overlap=_get(d, "tp_comm_overlap", bool, source, where, optional=True),
        overlap_param_gather=_get(d, "overlap_param_gather", bool, source, where,
                                  optional=True),
        **{k: _get(d, k, bool, source, where, optional=True)
           for k in ("account_for_embedding_in_pipeline_split",
                     "account_for_loss_in_pipeline_split", "gradient_accumulation_fusion")})
    if lay.attention_kernel is not None and lay.attention_kernel not in ATTENTION_KERNELS:
        raise ConfigError(f"has value {lay.attention_kernel!r}", source=source,
                          field=f"{where}.attention_kernel",
                          expected=" | ".join(ATTENTION_KERNELS))
    if lay.recompute is not None and lay.recompute not in RECOMPUTE:
        raise ConfigError(f"has value {lay.recompute!r}", source=source,
                          field=f"{where}.recompute", expected=" | ".join(RECOMPUTE))
    return lay


def _run(d: Any, group: str, source: str, index: int) -> PublishedRun:
    where = f"{group}[{index}]"
    if not isinstance(d, Mapping):
        raise ConfigError("is not a mapping", source=source, field=where)
    rid = _get(d, "id", str, source, where)
    where = f"{group}[{rid}]"
    src = d.get("source")
    if not isinstance(src, Mapping) or not (src.get("paper") or src.get("repository")) \
            or not src.get("table"):
        raise ConfigError("must name a paper or repository and a table", source=source,
                          field=f"{where}.source")
    published = d.get("published")
    if not isinstance(published, Mapping) or not (
            "tflops_per_gpu" in published or "step_time_s" in published):
        raise ConfigError("gives neither tflops_per_gpu nor step_time_s", source=source,
                          field=f"{where}.published")
    for key, value in published.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"has value {value!r}", source=source,
                              field=f"{where}.published.{key}", expected="a positive number")
    convention = _get(d, "flop_convention", str, source, where)
    if convention not in FLOP_CONVENTIONS:
        raise ConfigError(f"has value {convention!r}", source=source,
                          field=f"{where}.flop_convention",
                          expected=" | ".join(FLOP_CONVENTIONS))
    verified = _get(d, "verified", bool, source, where)
    unverified = str(d.get("unverified") or "")
    if not verified and not unverified:
        raise ConfigError("verified is false but `unverified` does not say why",
                          source=source, field=f"{where}.unverified")
    verified_from = d.get("verified_from") or ()
    if verified and not verified_from:
        raise ConfigError("verified is true but names no source read", source=source,
                          field=f"{where}.verified_from")
    assumed = d.get("assumed") or {}
    if not isinstance(assumed, Mapping) or (assumed and not assumed.get("why")):
        raise ConfigError("must be a mapping that says why", source=source,
                          field=f"{where}.assumed")
    unknown = sorted(set(assumed) - ASSUMABLE - {"why"})
    if unknown:
        raise ConfigError(f"names {unknown}", source=source, field=f"{where}.assumed",
                          expected=" | ".join(sorted(ASSUMABLE)))
    run = PublishedRun(
        id=rid, group=group, source=dict(src), row=str(_get(d, "row", str, source, where)),
        verified=verified, verified_from=tuple(str(x) for x in verified_from),
        model=_shape(d.get("model"), source, f"{where}.model"),
        gpus=_get(d, "gpus", int, source, where), device=_get(d, "device", str, source, where),
        precision=_get(d, "precision", str, source, where),
        layout=_layout(d.get("layout"), source, f"{where}.layout"),
        published={k: float(v) for k, v in published.items()},
        flop_convention=convention, unverified=unverified, notes=str(d.get("notes") or ""),
        assumed=dict(assumed))
    if run.layout.num_devices != run.gpus:
        raise ConfigError(f"TP x PP x DP x CP = {run.layout.num_devices} but gpus = {run.gpus}",
                          source=source, field=f"{where}.layout")
    return run


def load_published(path: str | Path) -> PublishedSet:
    """Read the cited rows; every error names the file and the field."""
    path = Path(path)
    source = str(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("does not exist", source=source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"is not valid YAML ({exc})", source=source) from None
    if not isinstance(doc, Mapping):
        raise ConfigError("top level is not a mapping", source=source)
    runs: list[PublishedRun] = []
    for group in GROUPS:
        rows = doc.get(group) or []
        if not isinstance(rows, list):
            raise ConfigError("is not a list", source=source, field=group)
        runs.extend(_run(d, group, source, i) for i, d in enumerate(rows))
    ids = [r.id for r in runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"repeats ids {dup}", source=source, field="id")
    conventions = doc.get("conventions") or {}
    missing = sorted({r.flop_convention for r in runs} - set(conventions))
    if missing:
        raise ConfigError(f"does not describe {missing}", source=source, field="conventions")
    return PublishedSet(source=source, runs=tuple(runs), conventions=dict(conventions))
