"""`collect replay`: re-measure database rows as microbenchmarks and write them back.

Backends share one interface (`ReplayBackend`): `CpuBackend` (runs anywhere torch does),
`CudaBackend` (CUDA events, warm-up, optional L2 flush), `NpuBackend` (torch_npu under
msprof, durations read from op_summary).
"""

from perfcast.collect.replay.base import (
    DistributedLaunch,
    ReplayBackend,
    ReplayCase,
    ReplayOutcome,
    ReplaySettings,
)
from perfcast.collect.replay.cpu import CpuBackend
from perfcast.collect.replay.cuda import CudaBackend
from perfcast.collect.replay.npu import NpuBackend
from perfcast.collect.replay.writeback import (
    UPDATE_MODES,
    ReplayRun,
    make_backend,
    replay_database,
)

__all__ = ["CpuBackend", "CudaBackend", "DistributedLaunch", "NpuBackend", "ReplayBackend", "ReplayCase",
           "ReplayOutcome", "ReplayRun", "ReplaySettings", "UPDATE_MODES", "make_backend",
           "replay_database"]
