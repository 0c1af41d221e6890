"""`OpInvokeInfo`: the operator invocation a profiling data source looks up.

A thin, immutable adapter over perfcast's workload facts: the TensorCast operator name,
the tensors (shape, canonical dtype, format) and the named work axes (`q_tokens`,
`kv_len`, `heads`, `kv_heads`, `head_dim`, `message_bytes`, `participants`, ...). It is
built from a `CostQuery` (what the resolver passes to providers) or from a `Task`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfcast.core.frozen import FrozenDict
from perfcast.workload.tensors import TensorSpec


@dataclass(frozen=True)
class OpInvokeInfo:
    operator: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    dims: FrozenDict[str, Any] = field(default_factory=FrozenDict)

    @property
    def func(self) -> str:
        """Normalised operator name (without a `torch.ops.` prefix)."""
        return normalize_operator(self.operator)

    def dim(self, name: str, default: Any = None) -> Any:
        return self.dims.get(name, default)

    def tensor_inputs(self) -> tuple[TensorSpec, ...]:
        """Non-scalar inputs: profiling CSVs never list scalar tensors."""
        return tuple(t for t in self.inputs if len(t.shape) > 0)

    @staticmethod
    def from_query(query) -> OpInvokeInfo:
        dims = dict(query.dims)
        dims.setdefault("message_bytes", query.message_bytes)
        dims.setdefault("participants", query.participants)
        return OpInvokeInfo(operator=query.operator, inputs=tuple(query.inputs),
                            outputs=tuple(query.outputs), dims=FrozenDict(dims))


def normalize_operator(name: str) -> str:
    return name.removeprefix("torch.ops.")
