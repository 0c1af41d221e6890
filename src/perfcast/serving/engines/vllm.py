"""vLLM V1 scheduling (vllm/v1/core/sched/scheduler.py, Scheduler.schedule).

Every iteration first schedules the running requests (decodes take one token each,
the request whose prompt is partly computed takes the rest it can), then admits
waiting requests in arrival order, cutting the last prompt to fit, until the token
budget (`max_num_batched_tokens`) or `max_num_seqs` is spent. Chunked prefill is
always on in V1. KV blocks are allocated as tokens are computed; when a running
request cannot get a block the newest running request is preempted (recompute).
"""

from __future__ import annotations

from perfcast.serving.engines.base import Chunks, EnginePolicy


class VLLMV1Policy(EnginePolicy):
    name = "vllm_v1"

    def plan(self) -> tuple[Chunks, bool]:
        e = self.engine
        return self.fill(self.sched.token_budget - e.n_decoding), e.n_decoding > 0
