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
  At decode sizes a MoE's time is the expert weights it reads, so while the table's
  row does not reach every expert (`T k <= E`) a `balanced` query is asked at
  `balanced_equivalent_tokens(T, k, E)`, the token count whose table routing activates
  the same number of experts; beyond, the row at `T` reads all `E` and its latency is
  scaled by the fraction random routing activates (`balanced_routing_scale`; 0.88 at
  32 tokens of top-8 of 128, 0.98 at 64, 1 for prefill sizes).

* **What a measured module covers.** A `moe_perf` row times the whole fused MoE module
  (AIConfigurator runs the runtime's fused-MoE forward on `[num_tokens, hidden]`):
  activation quantisation, permute (sorting rows by expert), grouped GEMMs, activation
  and the top-k weighted unpermute. The workload emits permute and unpermute as their
  own tasks, tagged with the module's axes (`module = moe`, `module.*`); when the
  module itself is measured for this deployment, those tasks are answered with a
  declared zero that names the module's records (`MODULE_COVERS`), so nothing is
  counted twice; when it is not, they keep their own cost. Top-k gating is not
  declared covered (vLLM's collector passes precomputed top-k ids), nor the router
  GEMM or any dispatch/combine collective, which no collector times.

* **Physical floor.** A measured attention or GEMM answer faster than its query's bytes
  (KV cache, weights, activations) at the device's peak memory bandwidth cannot be the
  deployment's kernel: the collector's data stayed in cache (AIConfigurator's TRT-LLM
  1.2.0rc5 and 1.3.0rc10 generation-attention rows reach 5.4 TB/s on an H100 at batch
  128 x 4096 tokens, 3.35 TB/s peak; the 1.3.0rc20 rows of the same kernels, vLLM's and
  SGLang's stay at about 3.0 TB/s). Such an answer is raised to the bound and says so
  (component `below_memory_bound_s`). MoE queries are left alone: their bytes are an
  expectation under a routing model, not a minimum.

`MeasuredView(provider)` applies these in front of a measured provider; its name and
revision are the wrapped provider's, so provenance is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostEstimate, CostQuery, CostSubject, MatchKind, Miss
from perfcast.workload.tensors import TensorSpec

WEIGHT_KEYED = frozenset({"gemm", "moe"})
# operations whose query bytes (KV cache, weights, activations) every run must move
HBM_BOUNDED = frozenset({"attention", "gemm"})
# measured module operation -> the workload operations its rows already include
MODULE_COVERS = {"moe": frozenset({"moe_permute", "moe_unpermute"})}
COLLECTIVE_ALIASES = {"bf16": "fp16", "fp16": "bf16"}
_UNQUANTISED = frozenset({DType.FP32, DType.TF32, DType.BF16, DType.FP16})


def _quantised(dtype: str) -> bool | None:
    """True for a sub-16-bit weight format, None when the dtype is unknown."""
    try:
        d = DType(dtype)
    except ValueError:
        return None
    return d not in _UNQUANTISED and dtype_bytes(d) < 2


def evidence_dtype(query: CostQuery) -> str:
    """The dtype measured tables key this query by (see the module doc)."""
    if query.operation in WEIGHT_KEYED and len(query.inputs) > 1:
        weight = query.inputs[1].dtype
        if _quantised(weight):
            return DType(weight).value
    return query.dtype


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


def _moe_routing_view(query: CostQuery) -> tuple[CostQuery, str, float]:
    """The query in the table's routing terms, a note, and the latency scale."""
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


class MeasuredView:
    """A measured provider asked in the tables' terms (see the module doc)."""

    def __init__(self, inner, peak_memory_bw: float | None = None) -> None:
        """`peak_memory_bw` (bytes/s): the device's peak memory bandwidth; a measured
        answer for an operation in `HBM_BOUNDED` that is faster than its query's bytes at
        that bandwidth is raised to the bound."""
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision
        self.peak_memory_bw = peak_memory_bw

    def _queries(self, query: CostQuery) -> list[tuple[CostQuery, str, float]]:
        dtype = evidence_dtype(query)
        first = query if dtype == query.dtype else replace(query, dtype=dtype)
        notes = [] if first is query else [
            f"{query.operation} asked at its weight format {dtype} (compute {query.dtype})"]
        scale = 1.0
        if query.operation == "moe":
            first, note, scale = _moe_routing_view(first)
            notes += [note] if note else []
        out = [(first, "; ".join(notes), scale)]
        alias = COLLECTIVE_ALIASES.get(query.dtype)
        if query.subject is CostSubject.COMMUNICATION and alias:
            out.append((replace(query, dtype=alias),
                        f"{query.dtype} {query.operation} costed from {alias} rows of the "
                        "same message bytes (same transfer, same-width adds)", 1.0))
        return out

    def supports(self, query: CostQuery):
        module_query = self._module_query(query)
        if module_query is not None:
            return self.supports(module_query)
        answer = None
        for q, _, _ in self._queries(query):
            answer = self.inner.supports(q)
            if answer is True:
                return True
        return answer

    def _module_query(self, query: CostQuery) -> CostQuery | None:
        module = query.dims.get("module")
        if not isinstance(module, str) or query.operation not in MODULE_COVERS.get(module, ()):
            return None
        prefix = "module."
        dims = {k[len(prefix):]: v for k, v in query.dims.items() if k.startswith(prefix)}
        weight, act = dims.pop("weight_dtype", ""), dims.pop("act_dtype", "")
        if not weight or not act:
            return None
        # the module's math dtype: its activations' when the weights are quantised
        # (fp8_block x fp8 -> fp8, mxfp4 x bf16 -> bf16), else the weights'
        compute = str(weight) if _quantised(str(weight)) is False else str(act)
        return CostQuery(subject=CostSubject.OPERATOR, operation=module,
                         hardware=query.hardware, dtype=compute, engine="matrix",
                         dims=FrozenDict(dims), context=query.context,
                         inputs=(TensorSpec((1, 1), str(act)), TensorSpec((1, 1), str(weight))))

    def _covered(self, query: CostQuery, module_query: CostQuery):
        answer = self.estimate(module_query)
        if isinstance(answer, Miss):
            return Miss(f"{query.operation}: its {module_query.operation} module is not "
                        f"measured here ({answer.reason})")
        return CostEstimate(
            latency_s=0.0, method=answer.method, match_kind=MatchKind.DECLARED,
            provider=self.name, provider_revision=self.revision,
            source_revision=answer.source_revision, raw_record_ids=answer.raw_record_ids,
            validity=answer.validity, bottleneck="measured",
            assumptions=(f"{query.operation} is timed inside the measured "
                         f"{module_query.operation} module (records "
                         f"{', '.join(answer.raw_record_ids[:2])})",))

    def _memory_bound_s(self, query: CostQuery) -> float:
        if not self.peak_memory_bw or query.operation not in HBM_BOUNDED:
            return 0.0
        return (query.bytes_read + query.bytes_written) / self.peak_memory_bw

    def estimate(self, query: CostQuery):
        module_query = self._module_query(query)
        if module_query is not None:
            return self._covered(query, module_query)
        reasons = []
        for q, note, scale in self._queries(query):
            if self.inner.supports(q) is not True:
                continue
            answer = self.inner.estimate(q)
            if isinstance(answer, Miss):
                reasons.append(answer.reason)
                continue
            if scale != 1.0:
                answer = replace(answer, latency_s=answer.latency_s * scale)
            bound = self._memory_bound_s(query)
            if bound > answer.latency_s:
                raise_by = bound - answer.latency_s
                note = "; ".join(n for n in (note, (
                    f"measured {answer.latency_s * 1e6:.1f} us is below the "
                    f"{bound * 1e6:.1f} us its {(query.bytes_read + query.bytes_written) / 1e6:.1f}"
                    " MB need at peak memory bandwidth (the collector's data must have stayed "
                    "in cache); raised to the bound")) if n)
                answer = replace(answer, latency_s=bound,
                                 components=answer.components.replace(
                                     below_memory_bound_s=raise_by))
            if note:
                answer = replace(answer, assumptions=(*answer.assumptions, note))
            return answer
        return Miss("; ".join(reasons) or f"no measured {query.operation} at {query.dtype}")
