"""`scripts/gpu-check`: a GPU-backed plan's handlers run on this machine's GPU and checked.

    scripts/gpu-check --plan PLAN [--dry] [--json] [--text TEXT]

The plan is one `moelambda plan --traffic SPEC --slo-p99 S --hardware gpu` wrote for a model
with weights (MiniLM, the SmolLM2 MoE). The check synthesises it as `cdk deploy` would and
reads back, for each GPU-backed function, its image (Dockerfile.expert built with DEVICE=cuda)
and its placement (`ground.placement`: the device and dtype its handler builds its stages at);
`--dry` prints that and stops, on any machine. Otherwise, on a machine whose torch sees a CUDA
device, it runs the plan's workflow on moto with those functions' handlers on the GPU
(`moelambda run-local --on-device`) and prints, per function, the measured seconds against the
plan's, the output against the model's (float32 on the CPU), and the GPU memory torch held
against the accelerator memory the plan gave. Where no GPU is present it says so and exits 2.
It passes (exit 0) when the run succeeds, the output is within bfloat16's rounding of the
model's (`TOLERANCE` of the output's scale) and the memory fits.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ground.errors import MoelambdaError, UsageError

__all__ = ["TOLERANCE", "describe", "device", "main"]

TOLERANCE = 0.05  # bfloat16 keeps 8 bits of mantissa: a few per cent of the output's scale
_TORCH = "torch==2.13.0 from Dockerfile.expert's TORCH_CUDA_INDEX_URL (CUDA 12.8 wheels)"


def describe(plan_path: Path, work: Path) -> dict[str, Any]:
    """The dry form: the plan, the image and the placement each GPU-backed function gets, read
    back from the template and asset manifest the CDK app synthesises for the plan.

    Raises:
        UsageError: The plan has no GPU-backed function.
    """
    from ground.plan import Plan

    plan = Plan.load(plan_path)
    traffic = plan.traffic
    if traffic is None or not traffic.accelerated:
        raise UsageError(
            f"'{plan_path}' has no GPU-backed function: nothing to check on a GPU.",
            "make one with `moelambda plan --traffic SPEC --slo-p99 S --hardware gpu`.",
        )
    from cdk.app import DEFAULT_STACK, build_app
    from pipeline.local import function_label
    from pipeline.stacks import flat_template

    build_app(plan_path, work / "cdk.out", stack_name=DEFAULT_STACK)
    template = flat_template(work / "cdk.out", DEFAULT_STACK)
    images: dict[str, Any] = {}
    for manifest in (work / "cdk.out").glob("*.assets.json"):
        images |= json.loads(manifest.read_text()).get("dockerImages", {})
    functions = []
    for fn in template["Resources"].values():
        props = fn["Properties"] if fn["Type"] == "AWS::Lambda::Function" else {}
        if "AcceleratorConfig" not in props:
            continue
        env = props["Environment"]["Variables"]
        asset = images[props["Code"]["ImageUri"]["Fn::Sub"].rsplit(":", 1)[1]]["source"]
        functions.append(
            {
                "function": function_label(props["ImageConfig"]["Command"][0], env),
                "accelerator_gib": props["AcceleratorConfig"]["AcceleratorMemorySize"],
                "placement": f"{env.get('MOELAMBDA_DEVICE')} {env.get('MOELAMBDA_DTYPE')}",
                "image": {
                    "dockerfile": asset.get("dockerFile"),
                    "build_args": asset.get("dockerBuildArgs", {}),
                },
            }
        )
    return {
        "plan": str(plan_path),
        "model": plan.model.model,
        "deployment": plan.deployment,
        "instance_type": traffic.managed_instance_type,
        "instances": traffic.managed_instances,
        "torch": _TORCH,
        "functions": sorted(functions, key=lambda f: f["function"]),
        "run": f"moelambda run-local --plan {plan_path} --on-device --json",
    }


def device() -> dict[str, Any]:
    """This machine's GPU as torch and the driver see it.

    Raises:
        UsageError: torch sees no CUDA device (no GPU, or a CPU-only torch).
    """
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda or "none: a CPU-only wheel"
        raise UsageError(
            f"no GPU here: torch {torch.__version__} sees no CUDA device (its CUDA: {built}).",
            "run scripts/gpu-check on a machine with an NVIDIA GPU and CUDA torch "
            "(pip install torch==2.13.0 from PyTorch's CUDA index), or pass --dry to print "
            "the plan, image and placement it would use.",
        )
    found: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 3),
        "torch_cuda": torch.version.cuda,
    }
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, check=False)
        found["driver"] = done.stdout.strip().splitlines()[0] if done.returncode == 0 else None
    return found


def _run(plan_path: Path, text: str | None) -> dict[str, Any]:
    """`moelambda run-local --on-device --json` on the plan, its summary."""
    cli = "from moelambda.cli import main; main()"
    command = [sys.executable, "-c", cli, "run-local", "--plan", str(plan_path)]
    command += ["--on-device", "--json", *(["--text", text] if text else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if not done.stdout.strip():
        raise MoelambdaError(f"run-local failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def _verdict(dry: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Whether the run passed: it succeeded, its output is the model's within `TOLERANCE` of
    the output's scale, and the GPU memory torch held fits the smallest accelerator planned."""
    diff, scale = summary["max_abs_diff_vs_monolithic"], summary["max_abs_monolithic"]
    close = diff is not None and diff <= TOLERANCE * scale
    planned_gib = min(f["accelerator_gib"] for f in dry["functions"])
    peak = summary.get("gpu_memory_peak_gib")
    fits = peak is not None and peak <= planned_gib
    return {
        "succeeded": summary["status"] == "SUCCEEDED",
        "output_within_tolerance": close,
        "gpu_memory_fits": fits,
        "passed": summary["status"] == "SUCCEEDED" and close and fits,
    }


def _print(dry: dict[str, Any], found: dict[str, Any] | None, run: dict[str, Any] | None) -> None:
    print(f"plan {dry['plan']}: {dry['model']}, {dry['deployment']}, on {dry['instances']} x "
          f"{dry['instance_type']}; image {dry['torch']}")  # fmt: skip
    for f in dry["functions"]:
        args = " ".join(f"{k}={v}" for k, v in f["image"]["build_args"].items())
        print(f"  {f['function']}: {f['placement']}, {f['accelerator_gib']} GiB accelerator, "
              f"image {f['image']['dockerfile']} {args}")  # fmt: skip
    if found is None or run is None:
        print(f"would run: {dry['run']}")
        return
    print(f"GPU: {found['gpu']} ({found['memory_gib']} GiB), CUDA {found['torch_cuda']}, "
          f"driver {found.get('driver')}")  # fmt: skip
    summary, verdict = run["summary"], run["verdict"]
    for name, row in summary["predicted_vs_measured"]["functions"].items():
        print(f"  {name}: planned {row['predicted_s']} s, measured {row['measured_s']} s "
              f"({row['measured_over_predicted']} x)")  # fmt: skip
    print(f"output: max |GPU - model| {summary['max_abs_diff_vs_monolithic']:.3g} of a scale of "
          f"{summary['max_abs_monolithic']:.3g}; GPU memory held "
          f"{summary.get('gpu_memory_peak_gib')} GiB, host peak {summary.get('host_peak_mb')} MB "
          "(the model's reference run included); "
          f"{'passed' if verdict['passed'] else 'FAILED'}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--plan", type=Path, required=True, help="a GPU-backed plan JSON")
    parser.add_argument("--dry", action="store_true", help="print what it would run, and stop")
    parser.add_argument("--text", help="run one window of this text (default: the plan's batch)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        found = None if args.dry else device()  # no GPU: said before any synthesis
        with tempfile.TemporaryDirectory(prefix="moelambda-gpu-check-") as tmp:
            dry = describe(args.plan, Path(tmp))
        run = None
        if found is not None:
            summary = _run(args.plan, args.text)
            run = {"summary": summary, "verdict": _verdict(dry, summary)}
    except MoelambdaError as err:
        print(f"gpu-check: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"dry": dry, "device": found, **(run or {})}))
    else:
        _print(dry, found, run)
    return 0 if run is None or run["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
