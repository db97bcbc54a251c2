"""Measure the front door's batcher INIT on this machine: a fresh interpreter's import of
`functions.batcher` plus its first call's boto3 import and S3 and Step Functions clients, the
median of N fresh processes (the calibration file's `batcher_import_s`).

    PYTHONPATH=. python scripts/batcher-init.py [N] [--dry-run]

`--dry-run` names what would be measured and starts no process.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

CODE = (
    "import time; t = time.perf_counter(); import functions.batcher as b; "
    "import os; os.environ.setdefault('AWS_DEFAULT_REGION', 'us-east-1'); "
    "b._client('s3'); b._client('stepfunctions'); print(time.perf_counter() - t)"
)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    runs = int(args[0]) if args else 5
    if "--dry-run" in sys.argv[1:]:
        print(
            f"batcher_import_s: would time {runs} fresh interpreters importing functions.batcher "
            "and creating its S3 and Step Functions clients (dry run: nothing measured)"
        )
        return
    times = [
        float(
            subprocess.run(
                [sys.executable, "-c", CODE], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(runs)
    ]
    print(
        f"median {statistics.median(times):.3f} s over {runs} processes: "
        + ", ".join(f"{t:.3f}" for t in times)
    )


if __name__ == "__main__":
    main()
