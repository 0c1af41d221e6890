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

`MeasuredView(provider)` applies both in front of a measured provider; its name and
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


class MeasuredView:
    """A measured provider asked in the tables' terms (see the module doc)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision

    def _queries(self, query: CostQuery) -> list[tuple[CostQuery, str]]:
        dtype = evidence_dtype(query)
        first = query if dtype == query.dtype else replace(query, dtype=dtype)
        out = [(first, "" if first is query else
                f"{query.operation} asked at its weight format {dtype} (compute {query.dtype})")]
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
