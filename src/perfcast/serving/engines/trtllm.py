"""TensorRT-LLM in-flight batching (PyTorch backend, tensorrt_llm/_torch/pyexecutor).

Two steps per iteration:

* capacity scheduler (`CapacitySchedulerPolicy`): GUARANTEED_NO_EVICT (the default)
  schedules a new request only when KV blocks for its prompt and all of its max new
  tokens are free after the running requests' remaining needs; MAX_UTILIZATION
  reserves only the next step and pauses the most recently started request when
  blocks run out (its KV is freed; it recomputes later). In perfcast these are the
  KV admissions `reserve_full` and `incremental`.
* micro-batch scheduler: generation requests take one token each, then context
  requests in order up to `max_num_tokens`. Without `enable_chunked_context` (the
  default) a context joins only when its whole prompt fits; with it, a context is
  cut into chunks that are whole multiples of the chunk unit, `tokens_per_block`
  (pyexecutor/_util.py: `chunk_unit_size = tokens_per_block`), except the chunk that
  finishes the prompt (FIRST_COME_FIRST_SERVED chunking, the default policy).
"""

from __future__ import annotations

from enum import StrEnum

from perfcast.serving.backends import Admission
from perfcast.serving.engines.base import Chunks, EnginePolicy


class CapacitySchedulerPolicy(StrEnum):
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    MAX_UTILIZATION = "MAX_UTILIZATION"

    @property
    def admission(self) -> Admission:
        return (Admission.RESERVE_FULL if self is CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
                else Admission.INCREMENTAL)

    @classmethod
    def of(cls, admission: Admission) -> CapacitySchedulerPolicy:
        return (cls.GUARANTEED_NO_EVICT if admission is Admission.RESERVE_FULL
                else cls.MAX_UTILIZATION)


class TRTLLMPolicy(EnginePolicy):
    name = "trtllm_inflight"

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.capacity_policy = CapacitySchedulerPolicy.of(engine.kv.admission)
        self.chunk_unit = max(1, engine.kv.block_tokens)

    def chunk_size(self, need: int, budget: int) -> int:
        if need <= budget:
            return need
        return budget // self.chunk_unit * self.chunk_unit

    def plan(self) -> tuple[Chunks, bool]:
        e = self.engine
        return self.fill(self.sched.token_budget - e.n_decoding), e.n_decoding > 0
