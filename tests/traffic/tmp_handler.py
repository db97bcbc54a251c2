"""A handler for the environment tests: it writes into its environment's temporary directory."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
    path = os.path.join(tempfile.gettempdir(), "weights.bin")
    with open(path, "wb") as f:
        f.write(b"w" * 1024)
    return {"path": path, "pid": os.getpid()}
