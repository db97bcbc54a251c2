"""moelambda: serve Mixture-of-Experts models on serverless functions at the lowest bill.

This package is the top floor: the command line, and `moelambda.local.run_plan_locally` (what
`moelambda run-local` does), which puts cdk/, functions/, pipeline/ and planner/ together.
Nothing else imports it.
The model core lives in `moe`, profiling and prediction in `predictor`, planning in `planner`,
what they all share in `ground`.
"""

from __future__ import annotations

from ground import __version__

__all__ = ["__version__"]
