"""moelambda: serve Mixture-of-Experts models on serverless functions at the lowest bill.

This package is the top floor: the command line. Each command parses, calls one function of the
package that owns the work (the local runtime, `runtime`, for what runs a plan on this machine)
and renders. Nothing else imports it.
The model core lives in `moe`, profiling and prediction in `predictor`, planning in `planner`,
what they all share in `ground`.
"""

from __future__ import annotations

from ground import __version__

__all__ = ["__version__"]
