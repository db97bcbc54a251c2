"""Planning: calibration, cost model, solvers and the `Plan` they produce.

Only the calibration exists so far: the validated platform parameters (Lambda memory options
and limits, transfer timings, prices) that every later planning step reads instead of
hard-coding a number.
"""

from __future__ import annotations

from planner.calibration import Calibration, default_calibration_path, load_calibration

__all__ = ["Calibration", "default_calibration_path", "load_calibration"]
