"""Corrections of AIConfigurator kernel tables: what their collectors timed that a
deployment does not run, each with its source, applied in one place
(`MeasuredCorrections.apply`, called by `evidence.measured_view.MeasuredView` for every
measured answer, in `estimate`, `serve`, `search`, `validate` and `train` alike).

* **Routing of `moe_perf` rows** (`moe_routing_view`). AIConfigurator's `balanced`
  rows route token `i` to experts `i + j * ceil(E/k)` (spread evenly), so `T` tokens
  activate `min(E, T k)` distinct experts; the workload's routing model (each token
  picks `k` distinct experts at random) activates `E (1 - (1 - k/E)^T)` in expectation,
  fewer while `T k` is near `E` (Qwen3-235B, 16 tokens: 82 of 128, vs all 128 in the
  table). While the table's row does not reach every expert (`T k <= E`) a `balanced`
  query is asked at `balanced_equivalent_tokens(T, k, E)`; beyond, the row at `T` is
  scaled by the fraction random routing activates (`balanced_routing_scale`; 0.88 at 32
  tokens of top-8 of 128, 0.98 at 64, 1 for prefill sizes).
* **Physical floor** (`HBM_BOUNDED`). A measured attention or GEMM answer faster than its
  query's bytes at the device's peak memory bandwidth cannot be the deployment's kernel:
  the collector's data stayed in cache (the TRT-LLM 1.2.0rc5 and 1.3.0rc10
  generation-attention rows reach 5.4 TB/s on an H100 at batch 128 x 4096 tokens,
  3.35 TB/s peak; the 1.3.0rc20 rows of the same kernels, vLLM's and SGLang's stay at
  about 3.0 TB/s). Such an answer is raised to the bound (component
  `below_memory_bound_s`). MoE queries are left alone: their bytes are an expectation
  under a routing model, not a minimum.
* **Harness fixed cost** (`evidence.harness_overhead`). A GEMM table's per-call
  overhead (launches, activation quantisation, host time of an eager collector), fitted
  on the table, is not paid by an engine that replays CUDA graphs: for a GEMM of at
  most the engine's largest captured batch (`graph_max_tokens`, from the backend file)
  the fitted excess is taken off, never below the kernels' floor or the memory bound
  (component `harness_fixed_cost_s`, negative).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfcast.evidence.contracts import CostQuery

# operations whose query bytes (KV cache, weights, activations) every run must move
HBM_BOUNDED = frozenset({"attention", "gemm"})


def balanced_equivalent_tokens(tokens: float, topk: int, experts: int) -> float:
    """Tokens `T'` of a `balanced` table row that activate as many distinct experts as
    `tokens` routed at random, while the table does not yet reach every expert
    (`T k <= E`): `T' = E (1 - (1 - k/E)^T) / k`. Beyond that the table's row already
    reads every expert and `T` itself is read (the shortfall is a latency scale, see
    `balanced_routing_scale`). T = 1 maps to 1 (one token activates `k` experts either
    way)."""
    if tokens <= 0 or topk <= 0 or experts <= topk or tokens * topk > experts:
        return tokens
    return experts * (1.0 - (1.0 - topk / experts) ** tokens) / topk


def balanced_routing_scale(tokens: float, topk: int, experts: int) -> float:
    """Latency scale of a `balanced` row at `T` tokens with `T k > E`, where the table's
    spread routing activates all `E` experts: the fraction `E (1 - (1 - k/E)^T) / E` of
    them random routing activates. A decode-sized MoE reads its active experts' weights
    (the tables show it: Qwen3-235B fp8_block EP 4, 8 -> 16 tokens, 16 -> 32 active local
    experts, 0.13 -> 0.23 ms, then 0.23 -> 0.24 ms from 16 to 128 tokens with all
    active), so its time scales with the active experts; the routed rows' small share is
    scaled too (under 10 % at the sizes where the fraction is below 0.99). 1 while
    `T k <= E` (`balanced_equivalent_tokens` matches the expert count exactly there)."""
    if tokens <= 0 or topk <= 0 or experts <= topk or tokens * topk <= experts:
        return 1.0
    return 1.0 - (1.0 - topk / experts) ** tokens


def moe_routing_view(query: CostQuery) -> tuple[CostQuery, str, float]:
    """A MoE query in the table's routing terms, a note, and the latency scale."""
    dims = query.dims
    t, k, e = dims.get("tokens"), dims.get("topk"), dims.get("num_experts")
    if dims.get("distribution") != "balanced" or not all(
            isinstance(v, int) for v in (t, k, e)):
        return query, "", 1.0
    scale = balanced_routing_scale(t, k, e)
    if scale < 1.0 - 1e-9:
        return (query, f"moe table row scaled by {scale:.3f}: the experts {t} tokens routed "
                f"at random reach (top-{k} of {e}) of all those the row's routing reaches", scale)
    eq = balanced_equivalent_tokens(t, k, e)
    if abs(eq - t) < 1e-9:
        return query, "", 1.0
    value = int(round(eq)) if abs(eq - round(eq)) < 1e-9 else eq
    return (replace(query, dims=dims.replace(tokens=value)),
            f"moe table read at {eq:.2f} balanced-routing tokens: as many distinct experts "
            f"as {t} tokens routed at random (top-{k} of {e})", 1.0)


@dataclass(frozen=True)
class MeasuredCorrections:
    """The corrections of one deployment's measured answers. `peak_memory_bw` (bytes/s):
    the device's (None: no physical floor); `harness`: the GEMM table's
    `HarnessCorrection` (None: none fitted); `graph_max_tokens`: the engine's largest
    captured CUDA-graph batch (0: eager, or not an engine run: no harness cut)."""

    peak_memory_bw: float | None = None
    harness: object | None = None
    graph_max_tokens: int = 0

    @property
    def digest_parts(self) -> list:
        return [self.peak_memory_bw or 0.0,
                self.harness.to_json() if self.harness is not None else None,
                self.graph_max_tokens]

    def memory_bound_s(self, query: CostQuery) -> float:
        if not self.peak_memory_bw or query.operation not in HBM_BOUNDED:
            return 0.0
        return (query.bytes_read + query.bytes_written) / self.peak_memory_bw

    def apply(self, query: CostQuery, dtype: str, answer, scale: float = 1.0
              ) -> tuple[object, list[str]]:
        """`answer` (read for `query`, whose tables key it by `dtype`) corrected, and
        the notes saying how: routing scale, then the physical floor, then the harness
        cut."""
        notes: list[str] = []
        if scale != 1.0:
            answer = replace(answer, latency_s=answer.latency_s * scale)
        bound = self.memory_bound_s(query)
        if bound > answer.latency_s:
            raise_by = bound - answer.latency_s
            notes.append(
                f"measured {answer.latency_s * 1e6:.1f} us is below the {bound * 1e6:.1f} us "
                f"its {(query.bytes_read + query.bytes_written) / 1e6:.1f} MB need at peak "
                "memory bandwidth (the collector's data must have stayed in cache); raised "
                "to the bound")
            answer = replace(answer, latency_s=bound,
                             components=answer.components.replace(below_memory_bound_s=raise_by))
        answer, cut_note = self._cut_harness(query, dtype, answer, bound)
        if cut_note:
            notes.append(cut_note)
        return answer, notes

    def _cut_harness(self, query: CostQuery, dtype: str, answer, bound_s: float):
        c = self.harness
        m = query.dims.get("m")
        if (c is None or query.operation != "gemm" or not isinstance(m, int)
                or not self.graph_max_tokens or m > self.graph_max_tokens):
            return answer, ""
        impl = query.context.implementation_for("gemm", dtype)
        entry = c.lookup("gemm", dtype, impl)
        if entry is None or entry.excess_s <= 0.0:
            return answer, ""
        floor = max(entry.kernels_per_call * c.floor_s, bound_s)
        cut = min(entry.excess_s, max(0.0, answer.latency_s - floor))
        if cut <= 0.0:
            return answer, ""
        answer = replace(answer, latency_s=answer.latency_s - cut,
                         components=answer.components.replace(harness_fixed_cost_s=-cut))
        return answer, (f"{cut * 1e6:.1f} us of the table's per-call overhead not run under "
                        f"the engine's CUDA graphs ({impl} at {dtype}: {entry.describe()}; "
                        f"fitted on {c.source_revision or 'the table'}, {c.procedure})")
