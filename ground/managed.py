"""Lambda Managed Instances (LMI): how a managed function's execution environments are sized.

A capacity provider runs EC2 instances in the stack's VPC; functions attached to it run in
execution environments that Lambda starts ahead of invocations (no cold start, no INIT or
duration charge: the instances are billed, plus a management fee and a request price, from the
calibration file). The traffic simulator, the planner and the CDK app read these rules:

- An environment gets whole vCPUs, at least the CPU share its planned Lambda memory buys
  (one vCPU per `mb_per_vcpu` = 1,769 MB), so the plan's compute times still hold, and
  `MEMORY_GIB_PER_VCPU` GiB per vCPU: LMI's smallest ratio, the closest to Lambda's
  1.73 GiB per vCPU, and always more than the planned memory (so the weights fit).
- It serves `MAX_CONCURRENCY` = 1 invocation at a time: the handlers are CPU-bound torch (a
  second request would halve both one's speed) and keep one request's tensors at a time.
- A function keeps a fixed number of environments (its minimum and maximum): an invocation
  that finds all of them busy is throttled, as reserved concurrency throttles on demand.
"""

from __future__ import annotations

import math

__all__ = [
    "MAX_CONCURRENCY",
    "MB_PER_GIB",
    "MEMORY_GIB_PER_VCPU",
    "environment_memory_mb",
    "environment_vcpus",
]

MEMORY_GIB_PER_VCPU = 2  # ExecutionEnvironmentMemoryGiBPerVCpu: 2..8 GiB
MAX_CONCURRENCY = 1  # PerExecutionEnvironmentMaxConcurrency: 1..1600
MB_PER_GIB = 1024


def environment_vcpus(memory_mb: float, mb_per_vcpu: float) -> int:
    """Whole vCPUs of a managed environment for a function planned at `memory_mb` on Lambda."""
    return max(1, math.ceil(memory_mb / mb_per_vcpu - 1e-9))


def environment_memory_mb(memory_mb: float, mb_per_vcpu: float) -> int:
    """The managed environment's memory (the function's MemorySize under LMI), in MB."""
    return environment_vcpus(memory_mb, mb_per_vcpu) * MEMORY_GIB_PER_VCPU * MB_PER_GIB
