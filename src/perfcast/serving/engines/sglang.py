"""SGLang scheduling (python/sglang/srt/managers/scheduler.py, schedule_policy.py).

`Scheduler.get_next_batch_to_run` prefers a new prefill batch whenever requests wait
and one can be formed (`get_new_batch_prefill`, PrefillAdder); otherwise every
running request decodes. Chunked prefill (`chunked_prefill_size`) keeps one partly
computed request, continued first in the next prefill batch. With
`enable_mixed_chunk` (off by default) the running requests decode in the same batch,
and the chunk budget shrinks by their number (PrefillAdder `num_mixed_decode_tokens`).

Admission with `schedule_conservativeness` c > 0 follows PrefillAdder: a request
starts only when its remaining prompt plus min(max_new_tokens, 4096)
(`CLIP_MAX_NEW_TOKENS`) fits in the free KV after reserving, for every running
request, new_token_ratio x min(its remaining output, 4096) tokens (and the whole
clipped output of requests admitted in the same batch). The ratio starts at
min(0.7 c, 1) (`global_config.default_init_new_token_ratio` 0.7), falls by
(init - min) / 600 per decode step (`default_new_token_ratio_decay_steps`) to
min = 0.14 x init (`default_min_new_token_ratio_factor`), returns to init when the
engine is idle, and after a retraction becomes
min(1, (decoded tokens + 20 x running) / total max new tokens) of the survivors
(ScheduleBatch.retract_decode, `retract_decode_steps` 20). c = 0 turns the
reservation off: admission on the prompt alone.
"""

from __future__ import annotations

from perfcast.serving.engines.base import Chunks, EnginePolicy, Iteration

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20


class SGLangPolicy(EnginePolicy):
    name = "sglang"

    def __init__(self, engine) -> None:
        super().__init__(engine)
        c = self.sched.schedule_conservativeness
        self.reserving = c > 0
        self.wants_iterations = self.reserving
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * c, 1.0)
        self.min_ratio = min(self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.ratio = self.init_ratio
        # while one batch is formed: the running requests' reservation (computed only
        # when a cheap upper bound does not already admit), the requests admitted so
        # far and their clipped outputs
        self._running_reserve: float | None = None
        self._batch: list = []
        self._batch_new = 0.0
        self._max_out = 0      # largest output of any request admitted (bounds the rest)

    def _remaining(self, r) -> int:
        return max(r.output_tokens - self.engine.generated_of(r), 0)

    def _reserve(self) -> float:
        """new_token_ratio x clipped remaining output of the requests that were running
        when this batch started to form."""
        if self._running_reserve is None:
            self._running_reserve = self.ratio * self._running_clipped_remaining()
        return self._running_reserve

    def _running_clipped_remaining(self) -> int:
        """Sum of min(remaining output, 4096) over the running requests not in this batch.
        Running = prefilling + decoding; with one token per decode iteration a decoding
        request's remaining output is its finish counter (the decode heap's key) minus
        the engine's counter, so the heap is read without a call per request."""
        e, clip = self.engine, CLIP_MAX_NEW_TOKENS
        if e.tokens_per_step != 1.0:
            batch = {id(r) for r in self._batch}
            return sum(min(self._remaining(r), clip)
                       for r in e.running.values() if id(r) not in batch)
        c = e.counter
        total = sum([min(f - c, clip) if f > c else 0 for f, _, _ in e.decoding])
        total += sum(min(self._remaining(r), clip) for r in e.prefilling)
        # the batch's requests are running too (prefilling, or decoding on arrival)
        return total - sum(min(self._remaining(r), clip) for r in self._batch)

    def can_admit(self, r) -> bool:
        if not super().can_admit(r):
            return False
        if not self.reserving:
            return True
        e = self.engine
        self._max_out = max(self._max_out, r.output_tokens)
        new = min(self._remaining(r), CLIP_MAX_NEW_TOKENS)
        base = e.kv_used + e.need_tokens(r) + self._batch_new + new
        bound = self.ratio * len(e.running) * min(self._max_out, CLIP_MAX_NEW_TOKENS)
        if base + bound > e.capacity and base + self._reserve() > e.capacity:
            return False
        self._batch_new += new
        self._batch.append(r)
        return True

    def plan(self) -> tuple[Chunks, bool]:
        e = self.engine
        if e.waiting or e.prefilling:
            if self.reserving:
                self._running_reserve, self._batch, self._batch_new = None, [], 0.0
            mixed = self.sched.enable_mixed_chunk and e.n_decoding > 0
            chunks = self.fill(self.sched.token_budget - (e.n_decoding if mixed else 0))
            if chunks:
                return chunks, mixed
        return [], e.n_decoding > 0

    def on_iteration(self, record: Iteration) -> None:
        if self.reserving and record.decode_requests:
            self.ratio = max(self.ratio - self.decay * record.steps, self.min_ratio)

    def on_idle(self) -> None:
        self.ratio = self.init_ratio

    def on_preempt(self) -> None:
        if not self.reserving:
            return
        running = list(self.engine.running.values())
        total = sum(r.output_tokens for r in running)
        if total:
            decoded = sum(self.engine.generated_of(r) for r in running)
            self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(running)) / total)
