"""How a deployment's queries are read against measured kernel tables.

Two facts the workload's compute dtype does not state but the tables are keyed by:

* **Quantisation format of a weight-bearing kernel.** perfcast's compute dtype names
  the math rate (`fp8` for per-tensor and for 128x128 block-scaled FP8, `bf16` for a
  w4a16 MXFP4 MoE, which dequantises to bf16). AIConfigurator's `gemm_perf` and
  `moe_perf` rows are keyed by the quantisation mode (`fp8` vs `fp8_block`,
  `w4a16_mxfp4`, `int4_wo`), which are different kernels with different speeds
  (Qwen3-235B MoE at 8192 tokens: 0.75 ms per-tensor vs 1.41 ms block-scaled). For the
  operations in `WEIGHT_KEYED`, a query whose weight (its second input tensor) is
  quantised is asked at the weight's dtype; unquantised weights keep the compute dtype.
* **Same-width collectives.** A collective over bf16 moves exactly the bytes of one over
  fp16 and reduces with the same 16-bit adds, so NCCL's `half` rows are the same transfer:
  a collective query missing at one 16-bit float dtype is asked at the other
  (`COLLECTIVE_ALIASES`), and the estimate says so.

* **Routing of measured MoE tables.** AIConfigurator's `balanced` rows route token `i`
  to experts `i + j * ceil(E/k)` (spread evenly), so `T` tokens activate
  `min(E, T k)` distinct experts. The workload's routing model (each token picks `k`
  distinct experts at random) activates `E (1 - (1 - k/E)^T)` in expectation, fewer
  while `T k` is near `E` (Qwen3-235B, 16 tokens: 82 of 128, vs all 128 in the table).
  At decode sizes a MoE's time is the expert weights it reads, so a `balanced` query
  is asked at `balanced_equivalent_tokens(T, k, E)`, the token count whose table
  routing activates the same number of experts with the same routed rows once every
  expert is active (see that function).

`MeasuredView(provider)` applies these in front of a measured provider; its name and
revision are the wrapped provider's, so provenance is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.evidence.contracts import CostQuery, CostSubject, Miss

WEIGHT_KEYED = frozenset({"gemm", "moe"})
COLLECTIVE_ALIASES = {"bf16": "fp16", "fp16": "bf16"}
_UNQUANTISED = frozenset({DType.FP32, DType.TF32, DType.BF16, DType.FP16})


def evidence_dtype(query: CostQuery) -> str:
    """The dtype measured tables key this query by (see the module doc)."""
    if query.operation in WEIGHT_KEYED and len(query.inputs) > 1:
        try:
            weight = DType(query.inputs[1].dtype)
        except ValueError:
            return query.dtype
        if weight not in _UNQUANTISED and dtype_bytes(weight) < 2:
            return weight.value
    return query.dtype


def balanced_equivalent_tokens(tokens: float, topk: int, experts: int) -> float:
    """Tokens `T'` of a `balanced` table row that activate as many distinct experts as
    `tokens` routed at random: `T' = T - (min(E, T k) - E (1 - (1 - k/E)^T)) / k`.
    For `T k <= E` the expert counts match exactly (`T' k` = expected active experts);
    once the table activates every expert the shortfall `E - active` is removed in
    token units, so `T' -> T` as the random routing also reaches every expert. T = 1
    maps to 1 (one token activates `k` experts either way)."""
    if tokens <= 0 or topk <= 0 or experts <= topk:
        return tokens
    active = experts * (1.0 - (1.0 - topk / experts) ** tokens)
    return tokens - (min(experts, tokens * topk) - active) / topk


def _moe_routing_view(query: CostQuery) -> tuple[CostQuery, str]:
    dims = query.dims
    t, k, e = dims.get("tokens"), dims.get("topk"), dims.get("num_experts")
    if dims.get("distribution") != "balanced" or not all(
            isinstance(v, int) for v in (t, k, e)):
        return query, ""
    eq = balanced_equivalent_tokens(t, k, e)
    if abs(eq - t) < 1e-9:
        return query, ""
    value = int(round(eq)) if abs(eq - round(eq)) < 1e-9 else eq
    return (replace(query, dims=dims.replace(tokens=value)),
            f"moe table read at {eq:.2f} balanced-routing tokens: as many distinct experts "
            f"as {t} tokens routed at random (top-{k} of {e})")


class MeasuredView:
    """A measured provider asked in the tables' terms (see the module doc)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision

    def _queries(self, query: CostQuery) -> list[tuple[CostQuery, str]]:
        dtype = evidence_dtype(query)
        first = query if dtype == query.dtype else replace(query, dtype=dtype)
        notes = [] if first is query else [
            f"{query.operation} asked at its weight format {dtype} (compute {query.dtype})"]
        if query.operation == "moe":
            first, note = _moe_routing_view(first)
            notes += [note] if note else []
        out = [(first, "; ".join(notes))]
        alias = COLLECTIVE_ALIASES.get(query.dtype)
        if query.subject is CostSubject.COMMUNICATION and alias:
            out.append((replace(query, dtype=alias),
                        f"{query.dtype} {query.operation} costed from {alias} rows of the "
                        "same message bytes (same transfer, same-width adds)"))
        return out

    def supports(self, query: CostQuery):
        answer = None
        for q, _ in self._queries(query):
            answer = self.inner.supports(q)
            if answer is True:
                return True
        return answer

    def estimate(self, query: CostQuery):
        reasons = []
        for q, note in self._queries(query):
            if self.inner.supports(q) is not True:
                continue
            answer = self.inner.estimate(q)
            if isinstance(answer, Miss):
                reasons.append(answer.reason)
                continue
            if note:
                answer = replace(answer, assumptions=(*answer.assumptions, note))
            return answer
        return Miss("; ".join(reasons) or f"no measured {query.operation} at {query.dtype}")
