"""GPU-cluster backend: the same MoE model on GPUs instead of Lambda functions.

Aurora's expert placement and contention-free all-to-all schedule (`gpu.aurora`), Lina's
popularity-based expert scheduling (`gpu.lina`), a cluster catalogue with prices (`gpu.cluster`),
per-layer routing matrices from real traces (`gpu.traffic`), the plan document (`gpu.plan`), a real
multi-process run on torch.distributed (`gpu.run`) and the serverless-vs-GPU comparison
(`gpu.compare`). Specs: ../shared/specs/aurora.md and lyra-lina-adaptive-gating.md part B.
"""
