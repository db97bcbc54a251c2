"""Expert-selection prediction: routing traces, the profiler that records them, and (to come)
count tables, the Bayesian posterior and the Lina baselines."""

from __future__ import annotations

from predictor._profile import ProfileResult, profile_windows
from predictor._trace import TRACE_FILE, TRACE_VERSION, RoutingTrace

__all__ = ["TRACE_FILE", "TRACE_VERSION", "ProfileResult", "RoutingTrace", "profile_windows"]
