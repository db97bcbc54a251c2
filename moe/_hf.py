"""Loading a Hugging Face model and its tokenizer, quietly, with failures as `ModelError`s.

Its own module because both the conversion (`moe._model`) and the dense reference the converted
model is judged against (`moe._quality.dense_reference`) load the user's weights, and the
conversion measures quality: neither may import the other for it.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import torch
from torch import nn

from ground.errors import ModelError
from moe._registry import ModelSource

__all__ = ["load_hf", "load_tokenizer"]


def _hf_kwargs(source: ModelSource) -> dict[str, Any]:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return {"gguf_file": source.gguf_file} if source.gguf_file else {}


def _loading(source: ModelSource) -> contextlib.AbstractContextManager[Any]:
    """Turn a load failure into a `ModelError`; drop the GGUF reader's own tqdm bar, which
    transformers' switch does not reach and which would garble our progress display."""

    @contextlib.contextmanager
    def guard() -> Any:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                yield
        except (OSError, ValueError, KeyError, ImportError) as err:
            raise ModelError(
                f"cannot load the model in {source.path}: {err}",
                "check that the directory holds a complete Hugging Face model (config, weights, "
                "tokenizer) and that its architecture is supported.",
            ) from err

    return guard()


def load_tokenizer(source: ModelSource) -> Any:
    """The model's tokenizer alone: enough to check the text before the weights are loaded."""
    import transformers

    with _loading(source):
        return transformers.AutoTokenizer.from_pretrained(source.path, **_hf_kwargs(source))


def load_hf(source: ModelSource, tokenizer: Any = None) -> tuple[nn.Module, Any]:
    """Load a Hugging Face model (fp32, eager attention so weights are returned) and tokenizer
    (unless given)."""
    import transformers

    kwargs = _hf_kwargs(source)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(source)
    auto = (
        transformers.AutoModel
        if source.model_type == "bert"
        else transformers.AutoModelForCausalLM
    )
    with _loading(source):
        hf = auto.from_pretrained(
            source.path, attn_implementation="eager", dtype=torch.float32, **kwargs
        )
    return hf.eval(), tokenizer
