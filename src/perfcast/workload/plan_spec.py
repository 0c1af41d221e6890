"""ParallelPlan and Batch: how the model is laid out and what one step computes."""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.canonical import Record
from perfcast.core.errors import ConfigError


MOE_DISPATCH_MODES = ("auto", "all_reduce", "all_to_all", "all_gather")


@dataclass(frozen=True)
class ParallelPlan(Record):
    """Degrees of parallelism (TensorCast semantics).

    * Attention runs on `dp x tp` devices per pipeline stage: `dp` attention
      data-parallel ranks, each holding `1/dp` of the step's requests, each split over
      `tp` tensor-parallel devices. Dense MLPs follow attention (TP within a DP rank).
    * MoE layers span the same `dp x tp` devices as `ep x moe_tp`: experts are placed
      round-robin over `ep` ranks, each expert's intermediate dimension split `moe_tp`
      ways. `moe_tp = 0` derives it as `dp x tp / ep`.
    * `moe_dispatch`: how routed tokens reach their experts (`auto`: none on one
      device; `all_reduce` (tokens replicated by TP, outputs all-reduced) when dp = 1;
      `all_to_all` when moe_tp = 1; otherwise `all_gather` + `reduce_scatter`).
    * `expert_imbalance` >= 1: the most loaded EP rank receives this multiple of the
      mean routed rows (an explicit parameter; 1.0 = perfectly balanced).
    * `sp`: sequence parallelism shards norms along the tokens (TP ranks each norm
      1/tp of the tokens between a reduce-scatter and an all-gather).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    moe_tp: int = 0  # 0 = derived: tp x dp / ep
    sp: bool = False
    moe_dispatch: str = "auto"
    expert_imbalance: float = 1.0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"has value {value!r}", field=f"{name}_size",
                                  expected="a positive integer")
        if isinstance(self.moe_tp, bool) or not isinstance(self.moe_tp, int) or self.moe_tp < 0:
            raise ConfigError(f"has value {self.moe_tp!r}", field="moe_tp_size",
                              expected="a positive integer (or 0 to derive it)")
        if self.moe_dispatch not in MOE_DISPATCH_MODES:
            raise ConfigError(f"has value {self.moe_dispatch!r}", field="moe_dispatch",
                              expected=" | ".join(MOE_DISPATCH_MODES))
        if not (isinstance(self.expert_imbalance, (int, float))
                and self.expert_imbalance >= 1.0):
            raise ConfigError(f"has value {self.expert_imbalance!r}", field="expert_imbalance",
                              expected="a number >= 1 (1.0 = balanced)")

    def check_moe_layout(self) -> None:
        """MoE layers must span exactly the attention devices of a stage. Checked when
        MoE work is built (and by the CLI), so that plans used only as parameter holders
        (e.g. an EP size for a profiling lookup) stay constructible."""
        d = self.devices_per_stage
        if self.moe_tp:
            if self.ep * self.moe_tp != d:
                raise ConfigError(
                    f"ep_size x moe_tp_size = {self.ep} x {self.moe_tp} = "
                    f"{self.ep * self.moe_tp} does not equal dp_size x tp_size = "
                    f"{self.dp} x {self.tp} = {d}", field="moe_tp_size",
                    expected="MoE layers to span exactly the attention devices of a stage")
        elif d % self.ep:
            raise ConfigError(f"ep_size={self.ep} does not divide dp_size x tp_size = {d}",
                              field="ep_size", expected=f"a divisor of {d}")

    @property
    def moe_dispatch_mode(self) -> str:
        """The dispatch actually used (resolves `auto`, see the class docstring)."""
        if self.moe_dispatch != "auto":
            return self.moe_dispatch
        if self.devices_per_stage == 1:
            return "none"
        if self.dp == 1:
            return "all_reduce"
        return "all_to_all" if self.moe_tp_size == 1 else "all_gather"

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

    def per_dp_rank(self, dp: int) -> Batch:
        """The share of one attention-DP rank: every segment's requests split evenly;
        with a remainder this is the most loaded rank (ceil)."""
        if dp == 1:
            return self
        segs = tuple(BatchSegment(-(-s.num_requests // dp), s.q_tokens, s.context_tokens)
                     for s in self.segments)
        return Batch(segs, self.phase)

    @property
    def kv_tokens(self) -> int:
        """Tokens held in the KV cache after the step."""
        return sum(s.num_requests * (s.context_tokens + s.q_tokens) for s in self.segments)
