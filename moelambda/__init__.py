"""moelambda: serve Mixture-of-Experts models on serverless functions at the lowest bill.

This package is the top floor: the command line and the corpus reader. Nothing else imports it.
The model core lives in `moe`, profiling and prediction in `predictor`, planning in `planner`,
what they all share in `ground`.
"""

from __future__ import annotations

from ground import __version__

__all__ = ["__version__"]
