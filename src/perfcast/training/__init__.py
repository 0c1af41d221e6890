"""Training-step estimation: the forward graph of the workload builders, derived backward,
recompute, optimizer and DP/ZeRO work, costed by the same resolver as inference and
scheduled by `perfcast.plan` (1F1B / interleaved pipelines). See docs/training.md."""

from perfcast.training.estimate import (
    BREAKDOWN_KEYS,
    FLOP_CONVENTION,
    TrainingRequest,
    TrainingResult,
    estimate_training,
)
from perfcast.training.layout import TrainingLayout

__all__ = ["BREAKDOWN_KEYS", "FLOP_CONVENTION", "TrainingLayout", "TrainingRequest",
           "TrainingResult", "estimate_training"]
