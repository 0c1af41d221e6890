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

* **Corrections.** Every measured answer then passes the corrections of the tables'
  collectors (`evidence.importers.aiconfigurator_corrections`: MoE routing, the
  physical floor, the harness fixed cost under CUDA graphs), applied there in one place.

`MeasuredView(provider)` applies these in front of a measured provider; its name and
revision are the wrapped provider's, so provenance is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostEstimate, CostQuery, CostSubject, MatchKind, Miss
from perfcast.evidence.importers.aiconfigurator_corrections import (
    MeasuredCorrections,
    moe_routing_view,
)
from perfcast.workload.tensors import TensorSpec

WEIGHT_KEYED = frozenset({"gemm", "moe"})
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


class MeasuredView:
    """A measured provider asked in the tables' terms (see the module doc)."""

    def __init__(self, inner, peak_memory_bw: float | None = None, *, harness=None,
                 graph_max_tokens: int = 0) -> None:
        """`peak_memory_bw` (bytes/s): the device's peak memory bandwidth (the physical
        floor); `harness`: the GEMM table's fitted `HarnessCorrection`;
        `graph_max_tokens`: the engine's largest captured CUDA-graph batch (see
        `MeasuredCorrections`)."""
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision
        self.corrections = MeasuredCorrections(peak_memory_bw, harness, graph_max_tokens)

    @property
    def digest(self) -> str:
        from perfcast.core.canonical import content_digest
        from perfcast.evidence.contracts import provider_digest

        cached = self.__dict__.get("_digest")
        if cached is None:
            cached = self._digest = content_digest("perfcast.MeasuredView", [
                provider_digest(self.inner), self.corrections.digest_parts])
        return cached

    def _queries(self, query: CostQuery) -> list[tuple[CostQuery, str, float]]:
        dtype = evidence_dtype(query)
        first = query if dtype == query.dtype else replace(query, dtype=dtype)
        notes = [] if first is query else [
            f"{query.operation} asked at its weight format {dtype} (compute {query.dtype})"]
        scale = 1.0
        if query.operation == "moe":
            first, note, scale = moe_routing_view(first)
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
            answer, notes = self.corrections.apply(query, q.dtype, answer, scale)
            note = "; ".join(n for n in (note, *notes) if n)
            if note:
                answer = replace(answer, assumptions=(*answer.assumptions, note))
            return answer
        return Miss("; ".join(reasons) or f"no measured {query.operation} at {query.dtype}")
