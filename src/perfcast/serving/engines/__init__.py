"""Engine policies, one module per engine family (see base.EnginePolicy)."""

from __future__ import annotations

from perfcast.serving.backends import Policy
from perfcast.serving.engines.base import (EnginePolicy, Event, EventKind, Iteration, Role)
from perfcast.serving.engines.sglang import SGLangPolicy
from perfcast.serving.engines.trtllm import CapacitySchedulerPolicy, TRTLLMPolicy
from perfcast.serving.engines.vllm import VLLMV1Policy

POLICY_CLASSES: dict[Policy, type[EnginePolicy]] = {
    Policy.DECODE_FIRST: VLLMV1Policy,
    Policy.PREFILL_FIRST: SGLangPolicy,
    Policy.INFLIGHT: TRTLLMPolicy,
}

__all__ = ["POLICY_CLASSES", "CapacitySchedulerPolicy", "EnginePolicy", "Event", "EventKind",
           "Iteration", "Role", "SGLangPolicy", "TRTLLMPolicy", "VLLMV1Policy"]
