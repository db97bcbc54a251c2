"""moelambda: serve Mixture-of-Experts models on serverless functions at the lowest bill.

The package holds what every part shares: the command line, the error types and the corpus
reader. The model core lives in `moe`, profiling and prediction in `predictor`, planning in
`planner`.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
