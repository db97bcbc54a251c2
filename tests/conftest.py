"""Shared fixtures: the real MiniLM MoE model, and tiny random models of every family.

Tiny models are written with `save_pretrained` into a temporary directory, with MiniLM's real
tokenizer beside them, so they load through exactly the path a user's local directory takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

    # transformers 5 draws the weights while it builds the model (`init_weights` afterwards
    # leaves them as they are): seed first, or every process gets other weights.
    torch.manual_seed(0)
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


# The slowest test files, slowest first (`pytest --durations=0` summed per file, on two workers
# of this 2-core machine): from about 100 s (test_replay.py's real processes, in the slow set;
# test_metered.py in the fast one) down to about 10 s. `make test` and `make test-slow` run
# whole files on their two workers (--dist loadfile) in collection order
# (--no-loadscope-reorder): these go first, so the workers share the long files from the start
# and finish together on the short ones, instead of one worker running a long file alone at the
# end. Only the schedule changes; each run orders the files it selects.
SLOWEST_FIRST = (
    "tests/traffic/test_replay.py",
    "tests/serving/test_metered.py",
    "tests/test_readme_examples.py",
    "tests/moe/test_generate.py",
    "tests/moe/test_quality.py",
    "tests/serving/test_run_local.py",
    "tests/serving/test_stream.py",
    "tests/test_bench.py",
    "tests/moe/test_stages.py",
    "tests/serving/test_packed.py",
    "tests/planner/test_choose.py",
    "tests/serving/test_recovered.py",
    "tests/gpu/test_cli.py",
    "tests/cdk/test_stack.py",
    "tests/planner/test_api.py",
    "tests/planner/test_plan_cli.py",
    "tests/moe/test_local.py",
    "tests/test_cli.py",
    "tests/serving/test_workflow.py",
    "tests/serving/test_faults.py",
    "tests/cluster/test_reproduction.py",
    "tests/traffic/test_replay_shapes.py",
    "tests/serving/test_front_door.py",
    "tests/cdk/test_scanners.py",
    "tests/serving/test_driver.py",
    "tests/test_output.py",
    "tests/planner/test_backtest.py",
    "tests/planner/test_exact.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller tells each worker the run's model cache, and whether it
    schedules whole files in the workers' collection order (`--dist loadfile` or `loadscope`
    with `--no-loadscope-reorder`): only then does putting the slowest files first balance the
    workers. Under the default `--dist load` it would not: the first worker would get them all
    in its first batch."""
    import os

    from moe._cache import CACHE_ENV

    node.workerinput["moelambda_cache_dir"] = os.environ[CACHE_ENV]
    option = node.config.option
    node.workerinput["slowest_first"] = option.dist in ("loadfile", "loadscope") and not getattr(
        option, "loadscopereorder", True
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker scheduling whole files in order: `SLOWEST_FIRST` first, in its order;
    the other files, and the tests within every file, keep their order (a stable sort)."""
    if not getattr(config, "workerinput", {}).get("slowest_first"):
        return
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    """Keep the MoEfied-model cache of a test run private, so the first load really converts;
    the xdist workers share the controller's (`pytest_configure_node`), so a model two test
    files load is converted once per run, not once per worker (`moe._cache` locks an entry
    while it converts it)."""
    import os
    import tempfile

    from moe._cache import CACHE_ENV

    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        os.environ[CACHE_ENV] = workerinput["moelambda_cache_dir"]
    else:
        os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="moelambda-test-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process that made the run's cache removes it; a worker leaves it to the controller."""
    import os
    import shutil

    from moe._cache import CACHE_ENV

    cache = os.environ.pop(CACHE_ENV, "")
    if getattr(config, "workerinput", None) is None:
        shutil.rmtree(cache, ignore_errors=True)
