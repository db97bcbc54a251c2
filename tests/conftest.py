"""Shared fixtures: the real MiniLM MoE model, and tiny random models of every family.

Tiny models are written with `save_pretrained` into a temporary directory, with MiniLM's real
tokenizer beside them, so they load through exactly the path a user's local directory takes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from moe import MoEModel, load_corpus, load_model, make_windows, resolve_model


@pytest.fixture(scope="session")
def minilm() -> MoEModel:
    return load_model("minilm", experts=4, top_k=2, seed=0)


@pytest.fixture(scope="session")
def wiki_windows(minilm: MoEModel) -> np.ndarray:
    return make_windows(load_corpus("wiki"), minilm.tokenizer, tokens=512, window=128, seed=0)


def _tiny(kind: str, root: Path) -> Path:
    import transformers

    common = dict(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
    )
    if kind == "mixtral":
        config = transformers.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, sliding_window=None, **common
        )
        model = transformers.MixtralForCausalLM(config)
    elif kind == "olmoe":
        config = transformers.OlmoeConfig(
            num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, **common
        )
        model = transformers.OlmoeForCausalLM(config)
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    model.init_weights()
    path = root / kind
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(resolve_model("minilm").path).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {kind: _tiny(kind, root) for kind in ("mixtral", "olmoe", "llama")}


@pytest.fixture()
def token_windows() -> torch.Tensor:
    return torch.randint(1000, 30000, (3, 16), generator=torch.Generator().manual_seed(1))


def pytest_configure(config: pytest.Config) -> None:
    """Keep the MoEfied-model cache of a test run private, so the first load really converts."""
    import os
    import tempfile

    from moe._cache import CACHE_ENV

    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="moelambda-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    import os
    import shutil

    from moe._cache import CACHE_ENV

    shutil.rmtree(os.environ.pop(CACHE_ENV, ""), ignore_errors=True)
