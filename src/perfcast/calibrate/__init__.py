"""Calibration: observations in, immutable calibration revisions out (docs/calibration.md)."""

from perfcast.calibrate.revision import (CalibrationPart, CalibrationRevision, FittedParameter,
                                         make_part)
from perfcast.calibrate.store import (CalibrationStore, default_revision, load_calibration,
                                      read_revision)

__all__ = ["CalibrationPart", "CalibrationRevision", "CalibrationStore", "FittedParameter",
           "default_revision", "load_calibration", "make_part", "read_revision"]
