"""ParallelPlan and Batch: how the model is laid out and what one step computes."""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.canonical import Record
from perfcast.core.errors import ConfigError


@dataclass(frozen=True)
class ParallelPlan(Record):
    """Degrees of parallelism. Attention runs on dp x tp devices per stage; MoE layers
    span the same devices as ep x moe_tp. `sp` shards norms along the sequence."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    moe_tp: int = 0  # 0 = same as tp x dp / ep (derived)
    sp: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"has value {value!r}", field=f"{name}_size",
                                  expected="a positive integer")

    @property
    def devices_per_stage(self) -> int:
        return self.tp * self.dp

    @property
    def num_devices(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def moe_tp_size(self) -> int:
        if self.moe_tp:
            return self.moe_tp
        return max(1, self.devices_per_stage // self.ep)


@dataclass(frozen=True)
class BatchSegment(Record):
    """`num_requests` requests each computing `q_tokens` new tokens on top of
    `context_tokens` already in the KV cache."""

    num_requests: int
    q_tokens: int
    context_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1 or self.q_tokens < 1 or self.context_tokens < 0:
            raise ConfigError(f"invalid batch segment {self}", field="batch",
                              expected="num_requests >= 1, q_tokens >= 1, context >= 0")

    @property
    def tokens(self) -> int:
        return self.num_requests * self.q_tokens

    @property
    def is_decode(self) -> bool:
        return self.q_tokens == 1 and self.context_tokens > 0


@dataclass(frozen=True)
class Batch(Record):
    """One engine step: one or more segments (a mixed/chunked step has several)."""

    segments: tuple[BatchSegment, ...]
    phase: str = "prefill"  # prefill | decode | mixed

    @staticmethod
    def prefill(num_queries: int, query_length: int, context_length: int = 0) -> Batch:
        return Batch((BatchSegment(num_queries, query_length, context_length),), "prefill")

    @staticmethod
    def decode(num_queries: int, context_length: int, query_length: int = 1) -> Batch:
        return Batch((BatchSegment(num_queries, query_length, context_length),), "decode")

    @staticmethod
    def mixed(segments: tuple[BatchSegment, ...]) -> Batch:
        return Batch(tuple(segments), "mixed")

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.segments)

    @property
    def num_requests(self) -> int:
        return sum(s.num_requests for s in self.segments)

    @property
    def kv_tokens(self) -> int:
        """Tokens held in the KV cache after the step."""
        return sum(s.num_requests * (s.context_tokens + s.q_tokens) for s in self.segments)
