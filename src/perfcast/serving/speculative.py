"""Speculative decoding: a draft proposes K tokens, the target verifies them in one step.

A decode iteration with speculation (`SpeculativeStepCost`) runs

* the verify step: the target over K+1 tokens per decoding request (its last token and
  the K drafts): GEMMs over R x (K+1) tokens, logits for every one of them, attention
  with K+1 query tokens over each request's context;
* the draft (`DraftTerms`), as vLLM's EagleProposer runs it (vllm/v1/spec_decode/
  eagle.py, `propose`): a first pass over every token of the step, logits at the last
  position of each sequence, then K-1 passes over one token per sequence. TensorRT-LLM's
  MTP-Eagle worker has the same shape (tensorrt_llm/_torch/speculative/mtp.py: "(max_draft_len
  + 1) input tokens in the 1st draft forward and only one input token in the following
  draft forward"); SGLang's EAGLE worker splits it into a draft-extend over the accepted
  tokens and multi-step drafting (python/sglang/srt/speculative/eagle_worker.py).

Draft models, all built by the workload graph builder and costed by the step model's
resolver:

* `mtp`: the model's own MTP (next-n) module, `workload.families.decoder.mtp_modules`:
  embedding lookup, enorm/hnorm, `eh_proj` (2h -> h), one decoder layer of the model's
  kind, the final norm and the shared LM head. One module is reused for every pass (vLLM
  indexes layer `spec_step_idx % num_mtp_layers`), so a config declaring more modules
  costs the same per pass;
* `eagle`: EAGLE-1 (vllm/model_executor/models/llama_eagle.py): `fc` (2h -> h, replicated
  on TP ranks) over the embedding and the target's hidden state every pass, one Llama
  decoder layer, the target's LM head;
* `eagle3`: EAGLE-3 (llama_eagle3.py): `fc` (3 x target hidden -> h) fuses the target's
  three auxiliary hidden states once per step over the step's tokens; the first layer's
  QKV projection reads the embedding and the hidden state concatenated (2h wide, priced
  as the layer's own QKV GEMM plus one more of the same shape), then its own LM head over
  `draft_vocab_size` (the target vocabulary when the config has none);
* `ngram`: prompt lookup on the host (vllm/v1/spec_decode/ngram_proposer.py runs on the
  CPU): no GPU work, and its host time is not modelled.

EAGLE heads default to one Llama layer of the target's width (heads, KV heads, head dim,
intermediate size, vocabulary); `draft_model` gives the real head's config.json instead.

Acceptance is declared, not simulated: a deterministic mean model. Each verify step of a
request emits `1 + accepted` tokens, `accepted` being the mean accepted draft tokens per
verify step (0..K), or, from per-position rates a_1..a_K (a_i: the probability that
draft i is accepted given drafts 1..i-1 were),
`accepted = sum_i prod_{j<=i} a_j`. The KV cache grows by the same `1 + accepted` per
request per iteration, and K lookahead slots per running request are reserved on top (the
verify step writes K+1 positions).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from perfcast.core.errors import ConfigError
from perfcast.serving.step_cost import (_NODES, ZERO, Part, StepCostModel, StepShape,
                                         graph_part)
from perfcast.workload import Batch, ModelSpec, load_model_spec
from perfcast.workload.build import build_task_graph, memory_facts
from perfcast.workload.families.traits import traits_for
from perfcast.workload.graph import GraphBuilder, MemoryFacts
from perfcast.workload.model_spec import model_spec_from_config
from perfcast.workload.quant import precision_for_model


class SpeculativeMethod(StrEnum):
    MTP = "mtp"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    NGRAM = "ngram"


METHODS = tuple(m.value for m in SpeculativeMethod)
MAX_SPECULATIVE_TOKENS = 64


def expected_accepted(rates: tuple[float, ...]) -> float:
    """Mean accepted drafts per verify step from per-position acceptance rates:
    sum_i prod_{j<=i} a_j (draft i counts only when every earlier one was accepted)."""
    total, run = 0.0, 1.0
    for a in rates:
        run *= a
        total += run
    return total


def parse_acceptance(text: str) -> tuple[float, ...]:
    """`--acceptance`: one number (mean accepted draft tokens per verify step, 0..K) or K
    comma-separated per-position rates (each 0..1); `SpeculativeConfig` checks ranges."""
    try:
        return tuple(float(p) for p in str(text).split(","))
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as numbers", field="acceptance",
                          expected="one number (mean accepted tokens per verify step) or "
                                   "a comma list of per-position rates") from None


@dataclass(frozen=True)
class SpeculativeConfig:
    """`acceptance`: one value = mean accepted draft tokens per verify step (0..K);
    K values = per-position acceptance rates a_1..a_K (each 0..1)."""

    method: SpeculativeMethod | str
    num_speculative_tokens: int
    acceptance: tuple[float, ...]
    draft_model: str | ModelSpec | None = None   # EAGLE head config.json (default: derived)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "method", SpeculativeMethod(self.method))
        except ValueError:
            raise ConfigError(f"unknown speculative method {self.method!r}",
                              field="speculative", expected=" | ".join(METHODS)) from None
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"has value {k!r}", field="num_speculative_tokens",
                              expected=f"an integer from 1 to {MAX_SPECULATIVE_TOKENS}")
        acc = tuple(float(a) for a in self.acceptance)
        object.__setattr__(self, "acceptance", acc)
        if any(not math.isfinite(a) for a in acc) or not acc:
            raise ConfigError(f"has values {acc!r}", field="acceptance",
                              expected="finite numbers")
        if len(acc) == 1 and k > 1:
            if not 0.0 <= acc[0] <= k:
                raise ConfigError(f"mean accepted tokens {acc[0]:g} is outside 0..{k}",
                                  field="acceptance",
                                  expected=f"0 to num_speculative_tokens={k} accepted draft "
                                           "tokens per verify step")
        elif len(acc) == k:
            bad = [a for a in acc if not 0.0 <= a <= 1.0]
            if bad:
                raise ConfigError(f"per-position rates {bad} are outside 0..1",
                                  field="acceptance", expected="rates from 0 to 1")
        else:
            raise ConfigError(f"{len(acc)} values for num_speculative_tokens={k}",
                              field="acceptance",
                              expected=f"one mean (0..{k}) or {k} per-position rates")
        if self.draft_model is not None and self.method not in (SpeculativeMethod.EAGLE,
                                                                SpeculativeMethod.EAGLE3):
            raise ConfigError(f"a draft model does not apply to {self.method.value}",
                              field="draft_model", expected="eagle or eagle3")

    @property
    def loads_draft(self) -> bool:
        """Whether the engine holds a draft model or MTP layers (n-gram drafting has
        none), which an engine's own memory rule reserves room for."""
        return self.method != SpeculativeMethod.NGRAM

    @property
    def accepted_tokens(self) -> float:
        """Mean accepted draft tokens per verify step."""
        acc = self.acceptance
        if len(acc) == 1 and self.num_speculative_tokens > 1:
            return acc[0]
        return expected_accepted(acc)

    @property
    def tokens_per_step(self) -> float:
        """Tokens a decoding request emits per verify step: the accepted drafts plus the
        target's own (bonus or correction) token."""
        return 1.0 + self.accepted_tokens


# -- draft models ------------------------------------------------------------------------------
def eagle_draft_spec(target: ModelSpec, cfg: SpeculativeConfig) -> ModelSpec:
    """The EAGLE head: the user's config.json, else one Llama layer of the target's width.
    EAGLE-3 heads compute logits over `draft_vocab_size` when their config gives one."""
    if cfg.draft_model is not None:
        spec = (cfg.draft_model if isinstance(cfg.draft_model, ModelSpec)
                else load_model_spec(cfg.draft_model))
    else:
        spec = model_spec_from_config({
            "model_type": "llama", "architectures": ["EagleDraftHead"],
            "hidden_size": target.hidden_size, "num_attention_heads": target.num_heads,
            "num_key_value_heads": target.num_kv_heads, "head_dim": target.head_dim,
            "intermediate_size": target.intermediate_size or 4 * target.hidden_size,
            "vocab_size": target.vocab_size, "num_hidden_layers": 1,
            "torch_dtype": target.weight_dtype, "hidden_act": "silu",
            "tie_word_embeddings": False,
            # the head rotates the target's positions (the RoPE caches a stack gathers from)
            **{k: target.raw[k] for k in ("max_position_embeddings",) if k in target.raw}},
            name=f"EAGLE head of {target.name}", source=f"derived from {target.source}")
    draft_vocab = spec.raw.get("draft_vocab_size")
    if cfg.method is SpeculativeMethod.EAGLE3 and isinstance(draft_vocab, int) and draft_vocab > 0:
        spec = replace(spec, vocab_size=draft_vocab)
    return spec


def is_mtp_task(task, num_layers: int) -> bool:
    """A task of the MTP module(s) (`mtp*.` groups, layers past the main stack) or the
    embedding lookup the draft repeats."""
    lineage = task.lineage
    return (lineage.startswith(("mtp", "embed."))
            or (task.layers is not None and task.layers[0] >= num_layers))


def is_verify_batch(batch: Batch) -> bool:
    """One decode segment of several query tokens over a cached context. Engines run it
    on their decode path (vLLM's FlashMLA builder sends queries of up to 128 tokens
    there and reshapes them for spec decode: vllm/v1/attention/backends/mla/flashmla.py),
    so MLA takes its absorbed form."""
    segs = batch.segments
    return (batch.phase == "decode" and len(segs) == 1 and segs[0].q_tokens > 1
            and segs[0].context_tokens > 0)


class _VerifyGraphs:
    """Costed graphs of verify-shaped batches (absorbed MLA), kept apart from the
    shared cache of ordinary steps."""

    def _spec_split(self, batch: Batch, context_tasks: bool, *, keep=None,
                    extra=None, **options) -> Part:
        key = (context_tasks,) + tuple((s.num_requests, s.q_tokens, s.context_tokens)
                                       for s in batch.segments)
        hit = self._spec_graphs.get(key)
        if hit is not None:
            return hit
        if is_verify_batch(batch):
            options["mla_form"] = "absorbed"
        graph = build_task_graph(self.model, self.plan, batch, self.precision,
                                 **self.graph_options, **options)
        tasks = [t for t in graph.tasks if ("kv_len" in t.work.axes) == context_tasks]
        if extra is not None and not context_tasks:
            tasks += extra(batch)
        out = graph_part(tasks, self.resolver, self.system.name, self.context, keep)
        self.graphs_built += 1
        self._spec_graphs[key] = out
        return out

    def attn_verify_exact(self, requests: int, context: int) -> Part:
        """Attention with K+1 query tokens per request over `context` cached tokens."""
        q = self.spec.num_speculative_tokens + 1
        return self._memo(("ver", requests, context), lambda: self._split(
            Batch.decode(requests, max(context, 1), query_length=q), True))

    def attn_verify(self, requests: int, context: float) -> Part:
        return self.context_term(self.attn_verify_exact, requests, context)


class DraftTerms(_VerifyGraphs, StepCostModel):
    """Additive terms (body, head, attention) of one draft pass, built like the target's
    (`StepCostModel`) from the draft's own graphs."""

    def __init__(self, target: StepCostModel, spec: SpeculativeConfig) -> None:
        self.spec = spec
        self.method = spec.method
        self._spec_graphs: dict = {}
        self._keep = None
        self._options: dict = {}
        if spec.method is SpeculativeMethod.MTP:
            model, precision, plan = target.model, target.precision, target.plan
            declared = mtp_modules_declared(model)
            if declared < 1:
                field = traits_for(model).mtp_field or "num_nextn_predict_layers"
                raise ConfigError(f"model {model.name!r} declares no MTP module",
                                  source=model.source or None, field=field,
                                  expected="a model with MTP/next-n layers (e.g. DeepSeek-V3 "
                                           "num_nextn_predict_layers), or --speculative eagle")
            self._options = {"mtp_layers": 1}
            num_layers = model.num_layers
            self._keep = lambda t: is_mtp_task(t, num_layers)
        else:
            model = eagle_draft_spec(target.model, spec)
            precision = None
            plan = replace(target.plan, pp=1)
        super().__init__(model, plan, target.system, target.resolver, precision=precision,
                         context=target.context, overheads=target.overheads,
                         cuda_graph=target.cuda_graph, interpolate=target.interpolate,
                         stack=target.stack)
        self.target_hidden = target.model.hidden_size
        self._precision = precision or precision_for_model(model)
        if spec.method is SpeculativeMethod.MTP:
            self._check_mtp_built()

    def _check_mtp_built(self) -> None:
        graph = build_task_graph(self.model, self.plan, Batch.decode(self.dp, 16),
                                 self.precision, mtp_layers=1, **self.graph_options)
        if not any(t.lineage.startswith("mtp") for t in graph.tasks):
            raise ConfigError(f"the graph builder of model_type {self.model.model_type!r} "
                              "builds no MTP module", source=self.model.source or None,
                              field="model_type", expected="a family whose MTP layers are "
                              "built (DeepSeek-V3/Kimi-K2/DSA, Qwen3-Next/3.5, MiniMax-M2)")

    def _split(self, batch: Batch, context_tasks: bool) -> Part:
        extra = self._pass_gemms if self.method is not SpeculativeMethod.MTP else None
        return self._spec_split(batch, context_tasks, keep=self._keep, extra=extra,
                                **self._options)

    # -- EAGLE's projections that a Llama layer lacks -----------------------------------------
    def _gemms(self, batch: Batch, shapes) -> list:
        b = GraphBuilder(self.model, self.plan, batch, self._precision,
                         options=self.graph_options)
        tokens = b.local_batch.tokens
        for group, n, k, shards in shapes:
            b.gemm(group, tokens, n, k, weight_shards=shards,
                   replicas=1 if shards > 1 else self.plan.tp)
        return b.tasks

    def _pass_gemms(self, batch: Batch) -> list:
        """Every pass: EAGLE-1's `fc` (2h -> h); EAGLE-3's QKV over the second h of its
        2h-wide input."""
        m, tp = self.model, self.plan.tp
        if self.method is SpeculativeMethod.EAGLE:
            return self._gemms(batch, [("eagle.fc", m.hidden_size, 2 * m.hidden_size, 1)])
        kv = m.num_kv_heads // tp if m.num_kv_heads >= tp else 1
        qkv = (m.num_heads // tp + 2 * kv) * m.head_dim
        return self._gemms(batch, [("eagle3.qkv_hidden_half", qkv * tp, m.hidden_size, tp)])

    def fusion_exact(self, tokens: int) -> Part:
        """EAGLE-3's `fc` (3 x target hidden -> h) over one step's tokens per rank."""
        if self.method is not SpeculativeMethod.EAGLE3:
            return ZERO

        def build() -> Part:
            tasks = self._gemms(Batch.prefill(self.dp, tokens),
                                [("eagle3.fc", self.model.hidden_size, 3 * self.target_hidden, 1)])
            return graph_part(tasks, self.resolver, self.system.name, self.context)
        return self._memo(("fusion", tokens), build)

    def fusion(self, tokens: int) -> Part:
        return self._memo(("ifusion", tokens), lambda: self._interp1(self.fusion_exact, tokens))

    # -- one step's draft -------------------------------------------------------------------
    def step_part(self, shape: StepShape, rank_tokens: int,
                  rank_chunks: tuple[tuple[int, int], ...], padded: int | None) -> Part:
        """The draft of one iteration: a pass over the step's tokens (verify tokens of the
        decoding requests, prefill chunks), then K-1 passes of one token per sequence."""
        r, ctx = shape.decode_requests, shape.decode_context
        seqs = shape.sequences
        part = (self.body(padded or rank_tokens) + self.head(max(seqs, 1))
                + self.fusion(padded or rank_tokens) + self.attn_verify(r, ctx))
        for q, c in rank_chunks:
            part = part + self.attn_prefill(q, c)
        passes = self.spec.num_speculative_tokens - 1
        if passes <= 0:
            return part
        per_rank = -(-seqs // self.dp)
        small = self.cuda_graph.padded(per_rank) if padded else None
        one = self.body(small or per_rank) + self.head(max(seqs, 1))
        chunk_ctx = [c + q for q, c in shape.prefill]
        for j in range(1, passes + 1):
            step = one + self.attn_decode(r, ctx + j)
            if chunk_ctx:
                step = step + self.attn_decode(len(chunk_ctx), sum(chunk_ctx) / len(chunk_ctx) + j)
            part = part + step
        return part

    def memory(self) -> MemoryFacts:
        """Weights and KV cache bytes per token the draft adds on a device (the embedding
        and, for EAGLE-1, the LM head are the target's)."""
        graph = build_task_graph(self.model, self.plan, Batch.decode(self.dp, 1024),
                                 self.precision, **self.graph_options, **self._options)
        tied = self.method is SpeculativeMethod.EAGLE

        def own(t) -> bool:
            if t.lineage.startswith("embed.") or (tied and t.group == "final.lm_head"):
                return False
            return self._keep is None or self._keep(t)
        return memory_facts([t for t in graph.tasks if own(t)], self.plan)


def mtp_modules_declared(model: ModelSpec) -> int:
    field = traits_for(model).mtp_field
    value = model.raw.get(field) if field else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- the verify step ----------------------------------------------------------------------------
class SpeculativeStepCost(_VerifyGraphs, StepCostModel):
    """Iteration latency of a deployment that decodes speculatively. Prefill-only steps,
    decode steps and mixed steps all run the draft after the target (vLLM proposes after
    every step); decoding requests are verified with K+1 tokens each."""

    def __init__(self, target: StepCostModel, spec: SpeculativeConfig) -> None:
        super().__init__(target.model, target.plan, target.system, target.resolver,
                         precision=target.precision, context=target.context,
                         overheads=target.overheads, cuda_graph=target.cuda_graph,
                         interpolate=target.interpolate, graph_cache=target._graphs,
                         stack=target.stack)
        self.spec = spec
        self.target = target
        self._spec_graphs: dict = {}
        self.draft = None if spec.method is SpeculativeMethod.NGRAM else DraftTerms(target, spec)
        # tokens a decoding request emits per iteration, KV slots reserved beyond them
        self.tokens_per_decode_step = spec.tokens_per_step
        self.kv_lookahead_tokens = spec.num_speculative_tokens

    def _split(self, batch: Batch, context_tasks: bool) -> Part:
        if is_verify_batch(batch):
            return self._spec_split(batch, context_tasks)
        return super()._split(batch, context_tasks)

    def verify_rank(self, shape: StepShape) -> tuple[int, tuple[tuple[int, int], ...]]:
        """(tokens, prefill chunks) of the busiest attention-DP rank of the verify step."""
        q = self.spec.num_speculative_tokens + 1
        return self.busiest_rank(StepShape(shape.decode_requests * q, shape.decode_context,
                                           shape.prefill))

    def kernel_parts(self, shape: StepShape) -> tuple[Part, int | None]:
        """Verify step (target over R x (K+1) tokens, logits for each) plus the draft."""
        q = self.spec.num_speculative_tokens + 1
        r = shape.decode_requests
        tokens, chunks = self.verify_rank(shape)
        padded = self.graph_padded(shape, tokens)
        part = self.body(padded or tokens) + self.head(max(r * q + len(shape.prefill), 1))
        if r:
            part = part + self.attn_verify(r, shape.decode_context)
        for qt, c in chunks:
            part = part + self.attn_prefill(qt, c)
        if self.draft is not None:
            part = part + self.draft.step_part(shape, tokens, chunks, padded)
        return part, padded

    def draft_s(self, shape: StepShape) -> float:
        """GPU time of the draft of one iteration (0 for n-gram)."""
        if self.draft is None:
            return 0.0
        tokens, chunks = self.verify_rank(shape)
        padded = self.graph_padded(shape, tokens)
        return self.gpu_s(self.draft.step_part(shape, tokens, chunks, padded), padded)

    def decode_run_s(self, requests: int, context0: float, steps: int) -> np.ndarray:
        """Latencies of `steps` verify iterations whose mean context starts at `context0`
        and grows by `tokens_per_decode_step` per iteration."""
        if steps <= 0:
            return np.zeros(0)
        contexts = context0 + self.tokens_per_decode_step * np.arange(steps, dtype=float)

        def gpu(c: float) -> float:
            return self.gpu_s(*self.kernel_parts(StepShape(requests, c)))

        if not self.interpolate or steps <= 2:
            return self.with_host(np.array([gpu(float(c)) for c in contexts]), requests)
        # GPU time at the context grid nodes the run spans, interpolated in between
        i0 = bisect.bisect_right(_NODES, max(contexts[0], 1.0)) - 1
        i1 = bisect.bisect_left(_NODES, max(contexts[-1], 1.0))
        nodes = _NODES[max(i0, 0): i1 + 1]
        ys = [self._memo(("sdec", requests, n), lambda n=n: Part(gpu(n), 0.0)).kernel_s
              for n in nodes]
        return self.with_host(np.interp(np.maximum(contexts, 1.0),
                                        np.array(nodes, dtype=float), np.array(ys)), requests)

    def memory_facts(self) -> MemoryFacts:
        """The target's memory facts with the draft's weights and KV bytes per token added
        (engines keep the draft layers' cache in the same pool)."""
        base = self.target.memory_facts()
        if self.draft is None:
            return base
        extra = self.draft.memory()
        per_token = dict(base.kv_bytes_per_token)
        for window, b in extra.kv_bytes_per_token:
            per_token[window] = per_token.get(window, 0.0) + b
        return replace(base, weights=base.weights + extra.weights,
                       kv_bytes_per_token=tuple(sorted(per_token.items())))


def speculative_step(step: StepCostModel, spec: SpeculativeConfig | None) -> StepCostModel:
    """The step model of a deployment with speculation `spec` (`step` itself when None)."""
    return step if spec is None else SpeculativeStepCost(step, spec)
