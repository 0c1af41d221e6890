"""Observations: measured results (end-to-end serving runs, kernel latencies) as
immutable, content-addressed observation sets, and their correlation to tasks.

Depends on `perfcast.core`, `perfcast.workload` and, for reading kernel formats, the
existing readers in `perfcast.evidence` (importers, profiling, records) and
`perfcast.collect` (parse, and the collected-database reader built on it).
"""

from perfcast.observe.correlate import (
    LEVELS,
    NOT_SUPPORTED,
    CorrelationReport,
    LevelReport,
    TaskMatch,
    correlate,
)
from perfcast.observe.kernels import import_kernels
from perfcast.observe.model import (
    KernelObservation,
    ObservationManifest,
    ObservationSet,
    ObservationSource,
    ServingObservation,
    SourceFile,
)
from perfcast.observe.silicon import import_silicon
from perfcast.observe.store import ObservationStore, default_root

__all__ = [
    "LEVELS", "NOT_SUPPORTED", "CorrelationReport", "KernelObservation", "LevelReport",
    "ObservationManifest", "ObservationSet", "ObservationSource", "ObservationStore",
    "ServingObservation", "SourceFile", "TaskMatch", "correlate", "default_root",
    "import_kernels", "import_silicon",
]
