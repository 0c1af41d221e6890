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
* attention-DP balance (`attention_dp_config.enable_balance`, off by default;
  llmapi/llm_args.py AttentionDpConfig, PyExecutor._balance_adp_requests): context
  requests are held back while not every attention-DP rank has one, unless some rank
  has no generation request or `timeout_iters` (50) iterations have passed; when every
  rank has both, contexts wait `batching_wait_iters` (10) iterations to batch more.
  perfcast's engine steps the ranks of one attention-DP group together and spreads new
  requests over them, so "every rank has a context request" is "the iteration holds at
  least dp context requests" and "every rank generates" is "at least dp decoding".
  Held contexts keep their KV reservation; the decodes run meanwhile.
"""

from __future__ import annotations

from enum import StrEnum

from perfcast.serving.backends import Admission
from perfcast.serving.engines.base import Chunks, EnginePolicy, Iteration


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
        self.dp = int(getattr(engine.cost, "dp", 1))
        self.balancing = self.sched.attention_dp_balance and self.dp > 1
        self.wants_iterations = self.balancing
        self.waiting_iters = 0      # _adp_ctx_waiting_iters_count
        self.batching_iters = 0     # _adp_ctx_batching_wait_iters_count
        self._hold: str | None = None   # "waiting" | "batching" while contexts are held

    def chunk_size(self, need: int, budget: int) -> int:
        if need <= budget:
            return need
        return budget // self.chunk_unit * self.chunk_unit

    def plan(self) -> tuple[Chunks, bool]:
        e = self.engine
        chunks = self.fill(self.sched.token_budget - e.n_decoding)
        self._hold = None
        if chunks and self.balancing:
            self._hold = self._balance(len(chunks), e.n_decoding)
            if self._hold is not None:
                return [], True
        return chunks, e.n_decoding > 0

    def _balance(self, contexts: int, generating: int) -> str | None:
        """Why this iteration's contexts are held back (None: they run)."""
        all_gen = generating >= self.dp
        if contexts >= self.dp:
            self.waiting_iters = 0
            if all_gen and self.batching_iters < self.sched.attention_dp_batching_wait_iters:
                return "batching"
            if all_gen:
                self.batching_iters = 0
            return None
        if all_gen and self.waiting_iters + 1 < self.sched.attention_dp_timeout_iters:
            return "waiting"
        self.waiting_iters = 0
        return None

    def max_decode_steps(self) -> int | None:
        if self._hold == "batching":
            return self.sched.attention_dp_batching_wait_iters - self.batching_iters
        if self._hold == "waiting":
            return self.sched.attention_dp_timeout_iters - 1 - self.waiting_iters
        return None

    def on_iteration(self, record: Iteration) -> None:
        if self._hold == "batching":
            self.batching_iters += record.steps
        elif self._hold == "waiting":
            self.waiting_iters += record.steps
