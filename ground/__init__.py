"""The ground floor every other package stands on: no torch, boto3, CDK or CLI imports.

It holds what planning and deployment must agree on, once: the error types (`errors`), atomic
file writing (`files`), the weight manifest (`manifest`), the S3 key layout of requests
(`layout`), the scatter-gather methods (`method`), the Plan document (`plan`) and the deployment
semantics (`semantics`: what each function of the fan-out waits for, is billed for and requests;
`driver`: the same for a driver or one function holding the model; `generation`: a driver's
prefill and decode steps, TTFT and TPOT).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
