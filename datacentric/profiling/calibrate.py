"""Deprecated module: :mod:`datacentric.profiling.cpu_calibration` (fits the
``cpu-local`` preset to this machine; ``datacentric calibrate`` fits a GPU preset to
measurement files, :mod:`datacentric.planning.calibration`)."""

from __future__ import annotations

import sys
import warnings

from datacentric.profiling.cpu_calibration import (
    CPU_BASE,
    calibrate_cpu_local,
    calibration_cases,
    calibration_points,
    main,
)

__all__ = ["CPU_BASE", "calibrate_cpu_local", "calibration_cases", "calibration_points", "main"]

warnings.warn(
    "datacentric.profiling.calibrate is deprecated: use datacentric.profiling.cpu_calibration",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    sys.exit(main())
