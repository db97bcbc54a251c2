"""Time a GPU-backed driver's layer stage and one expert on this machine's GPU, beside the
prediction (`planner.hardware.gpu_model.GpuSpeed`) that `moelambda bench gpu-lambda` plans with.

    PYTHONPATH=. python scripts/gpu-lambda-timing.py [--shape mixtral] [--tokens 1000] [--gpu l4]

It builds one MoE layer of a built-in shape (`planner.shapes`) with random bf16 weights:
the attention block (q, k, v, o projections, grouped key/value heads, causal scaled-dot-product
attention, RMS norms) and one SwiGLU expert, runs each `--repeats` times on `--tokens` tokens
after a warm-up, and prints the median seconds with the prediction for the catalogue's `--gpu`
type at a whole GPU. Without CUDA it says so and exits 1: CPU timings are `moelambda
calibrate`'s. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch


def _timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="mixtral")
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--gpu", default="l4", help="catalogue type to compare against")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to time (CPU timings: moelambda calibrate).")
        return 1
    from planner.hardware.catalogue import load_catalogue
    from planner.hardware.gpu_model import GpuSpeed
    from planner.shapes import load_shape

    shape = load_shape(args.shape)
    attention = shape.attention
    if attention.kind != "gqa":
        print(f"{args.shape}: only grouped-query attention is timed here.")
        return 1
    dev, dtype, h, n = torch.device("cuda"), torch.bfloat16, shape.hidden, args.tokens
    heads, kv = attention.heads, attention.kv_heads
    head_dim = h // heads

    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device=dev, dtype=dtype) * 0.02

    q, k, v, o = (
        w(h, heads * head_dim),
        w(h, kv * head_dim),
        w(h, kv * head_dim),
        w(heads * head_dim, h),
    )
    gate, up, down = w(h, shape.expert_ffn), w(h, shape.expert_ffn), w(shape.expert_ffn, h)
    x = torch.randn(n, h, device=dev, dtype=dtype)
    norm = torch.nn.RMSNorm(h, device=dev, dtype=dtype)

    def layer() -> torch.Tensor:
        y = norm(x)
        qs = (y @ q).view(n, heads, head_dim).transpose(0, 1)
        ks = (y @ k).view(n, kv, head_dim).transpose(0, 1).repeat_interleave(heads // kv, 0)
        vs = (y @ v).view(n, kv, head_dim).transpose(0, 1).repeat_interleave(heads // kv, 0)
        a = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        return norm(x + a.transpose(0, 1).reshape(n, h) @ o)

    def expert() -> torch.Tensor:
        return (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down

    with torch.inference_mode():
        layer_s, expert_s = _timed(layer, args.repeats), _timed(expert, args.repeats)
    speed = GpuSpeed.of(load_catalogue(), args.gpu)
    layer_params = float(h * (heads + 2 * kv) * head_dim + heads * head_dim * h)
    expert_params = float(3 * h * shape.expert_ffn)
    predicted = speed.seconds(np.array([layer_params, expert_params]), np.array([n, n]), 1.0)
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "shape": args.shape,
                "tokens": n,
                "measured_s": {"layer": layer_s, "expert": expert_s},
                "predicted_s": {"layer": float(predicted[0]), "expert": float(predicted[1])},
                "predicted_for": args.gpu,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
