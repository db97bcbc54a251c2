"""The MoE model against Hugging Face, and the exported stages against the monolithic forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from moe import MoEModel, StageLoader, export_model, load_model, run_staged
from moe._model import load_hf
from moe._registry import resolve_model

TOL = 1e-5
# The conversions below are compared with the dense model and the stages directly: their
# quality block (measured on 16,384 held-out tokens, most of a conversion's time) is not read,
# and is tested in test_quality.py.
NO_QUALITY = 0


def _hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    hf, _ = load_hf(resolve_model(str(path)))
    with torch.inference_mode():
        return hf(ids).logits


def test_minilm_stages_equal_monolithic(
    minilm: MoEModel, wiki_windows: np.ndarray, tmp_path: Path
) -> None:
    ids = torch.from_numpy(wiki_windows[:2])
    reference = minilm.forward(ids, reference=True)
    export_model(minilm, tmp_path / "w")
    staged = run_staged(tmp_path / "w", ids)
    assert reference.shape == (2, 384)
    assert (staged - reference).abs().max() <= TOL
    assert (minilm.forward(ids) - reference).abs().max() <= TOL


def test_minilm_with_every_expert_is_the_dense_model(wiki_windows: np.ndarray) -> None:
    """E=2, k=2 runs all experts with unit weights: the partition must sum to the dense FFN."""
    from sentence_transformers import SentenceTransformer

    model = load_model(
        "minilm", experts=2, top_k=2, fit_tokens=512, cache=False, quality_tokens=NO_QUALITY
    )
    ids = torch.from_numpy(wiki_windows[:2])
    dense = SentenceTransformer(str(resolve_model("minilm").path), device="cpu")
    with torch.inference_mode():
        expected = dense({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert (model.forward(ids) - expected["sentence_embedding"]).abs().max() <= TOL


def test_minilm_routing_is_not_uniform(minilm: MoEModel) -> None:
    """The fitted routers must beat chance at picking the experts with the most activation."""
    chance = 1 / 6  # C(4, 2) possible expert pairs
    assert all(f.router_accuracy > 3 * chance for f in minilm.fits)
    assert all(0.5 < f.mass_captured <= 1.0 + 1e-6 for f in minilm.fits)


@pytest.mark.parametrize("kind", ["mixtral", "olmoe"])
def test_native_moe_matches_hugging_face(
    kind: str, tiny_dirs: dict[str, Path], token_windows: torch.Tensor, tmp_path: Path
) -> None:
    model = load_model(str(tiny_dirs[kind]), experts=None, top_k=None)
    assert (model.experts, model.top_k, model.moefied) == (4, 2, False)
    expected = _hf_logits(tiny_dirs[kind], token_windows)
    reference = model.forward(token_windows, reference=True)
    assert expected.abs().max() > 1e-2  # the check below is not trivially met by zeros
    assert (reference - expected).abs().max() <= TOL
    assert (model.forward(token_windows) - expected).abs().max() <= TOL
    export_model(model, tmp_path / "w")
    assert (run_staged(tmp_path / "w", token_windows) - expected).abs().max() <= TOL


def _tiny_llama(tiny_dirs: dict[str, Path], *, experts: int, top_k: int) -> MoEModel:
    """The tiny Llama MoEfied afresh on 256 fit tokens, without its quality block."""
    return load_model(
        str(tiny_dirs["llama"]),
        experts=experts,
        top_k=top_k,
        fit_tokens=256,
        cache=False,
        quality_tokens=NO_QUALITY,
    )


def test_moefied_llama_with_every_expert_is_dense(
    tiny_dirs: dict[str, Path], token_windows: torch.Tensor, tmp_path: Path
) -> None:
    model = _tiny_llama(tiny_dirs, experts=2, top_k=2)
    expected = _hf_logits(tiny_dirs["llama"], token_windows)
    assert (model.forward(token_windows) - expected).abs().max() <= TOL


def test_moefied_llama_stages_equal_monolithic(
    tiny_dirs: dict[str, Path], token_windows: torch.Tensor, tmp_path: Path
) -> None:
    model = _tiny_llama(tiny_dirs, experts=4, top_k=1)
    reference = model.forward(token_windows, reference=True)
    export_model(model, tmp_path / "w")
    assert (run_staged(tmp_path / "w", token_windows) - reference).abs().max() <= TOL
    # Top-1 of 4 experts drops most of the FFN: the output must differ from the dense model.
    assert (reference - _hf_logits(tiny_dirs["llama"], token_windows)).abs().max() > 1e-4


def test_export_records_expert_sizes(minilm: MoEModel, tmp_path: Path) -> None:
    manifest = export_model(minilm, tmp_path / "w")
    sizes = np.array(manifest.expert_bytes())
    params = 2 * 384 * 384 + 384  # w_in (384x384), b_in (384), w_out (384x384) of a quarter FFN
    assert sizes.shape == (6, 4)
    assert (sizes >= params * 4).all() and (sizes < params * 4 + 1024).all()
    for stage in manifest.stages:
        assert (tmp_path / "w" / stage.key).stat().st_size == stage.bytes
    loader = StageLoader(tmp_path / "w")
    x = torch.randn(5, 384)
    expected = minilm.banks[3].expert(1, x)
    assert torch.equal(loader.expert(3, 1).run(x), expected)


def test_export_refuses_to_overwrite(minilm: MoEModel, tmp_path: Path) -> None:
    from ground.errors import OutputExistsError

    out = tmp_path / "w"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(OutputExistsError):
        export_model(minilm, out)
    assert (out / "keep.txt").read_text() == "user data"
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # no temporary directory left behind


def test_missing_weights_object_is_a_clear_error(minilm: MoEModel, tmp_path: Path) -> None:
    from ground.errors import ModelError

    export_model(minilm, tmp_path / "w")
    (tmp_path / "w" / "layers/02/experts/01.safetensors").unlink()
    with pytest.raises(ModelError, match="layers/02/experts/01.safetensors"):
        StageLoader(tmp_path / "w").expert(2, 1)


def test_cached_model_is_the_built_model(
    minilm: MoEModel, wiki_windows: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moe._cache

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached model must not be converted again")

    monkeypatch.setattr(moe._cache, "build_model", no_build)
    cached = load_model("minilm", experts=4, top_k=2, seed=0)
    ids = torch.from_numpy(wiki_windows[:2])
    assert torch.equal(cached.forward(ids), minilm.forward(ids))
    assert cached.fits == minilm.fits
    monkeypatch.undo()
    other_seed = load_model("minilm", experts=4, top_k=2, seed=1, cache=False, quality_tokens=0)
    assert not torch.equal(other_seed.routers[0].linear.weight, minilm.routers[0].linear.weight)


@pytest.mark.slow  # the real 30-layer SmolLM2 from its GGUF file
def test_smollm2_gguf_stages_equal_monolithic(tmp_path: Path) -> None:
    """The decoder default: GGUF weights, tied LM head exported as its own tensor, 30 layers."""
    model = load_model(
        "smollm2", experts=4, top_k=2, fit_tokens=512, cache=False, quality_tokens=0
    )
    assert (model.num_layers, model.hidden_size, model.family.name) == (30, 576, "decoder")
    ids = torch.tensor([model.tokenizer("The capital of France is Paris.")["input_ids"]])
    reference = model.forward(ids, reference=True)
    assert reference.shape == (1, ids.shape[1], 49152)
    export_model(model, tmp_path / "w")
    # 30 layers and logits near 20: fp32 rounding is relative here, so the bound is too.
    difference = (run_staged(tmp_path / "w", ids) - reference).abs().max()
    assert difference <= TOL * reference.abs().max()


@pytest.mark.parametrize("name", ["gelu", "gelu_pytorch_tanh", "relu", "silu", "swish"])
def test_activations_are_hugging_faces(name: str) -> None:
    """The experts' own activation table must compute what transformers names the same."""
    from transformers.activations import ACT2FN

    from moe._experts import _activation

    x = torch.linspace(-6, 6, 1001)
    assert torch.equal(_activation(name)(x), ACT2FN[name](x))


def test_an_expert_handler_does_not_import_transformers(minilm: MoEModel, tmp_path: Path) -> None:
    """Every cold start of an expert function would pay about 4 s more for it."""
    import subprocess
    import sys

    export_model(minilm, tmp_path / "w")
    code = (
        "import sys; import functions.expert; from moe import StageLoader; "
        f"StageLoader({str(tmp_path / 'w')!r}).expert(0, 0); "
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _staged_at(root: Path, ids: torch.Tensor, placement: object) -> torch.Tensor:
    from moe import local_experts, run_stages

    loader = StageLoader(root, placement)  # type: ignore[arg-type]
    m = loader.manifest
    experts = local_experts(loader.expert, m.experts, m.hidden_size)
    return run_stages(loader, m.num_layers, ids, experts)


@pytest.mark.parametrize("model_name", ["minilm", "llama"])
def test_stages_placed_at_bfloat16_follow_the_float32_ones(
    model_name: str,
    minilm: MoEModel,
    tiny_dirs: dict[str, Path],
    wiki_windows: np.ndarray,
    token_windows: torch.Tensor,
    tmp_path: Path,
) -> None:
    """A GPU-backed function's placement (bfloat16) on the CPU: every stage, router and
    expert is built at that dtype and the layer loop runs through it (a float32 tensor made
    anywhere in the loop would fail a matmul), close to the float32 stages."""
    from ground.placement import Placement

    if model_name == "minilm":
        model, ids = minilm, torch.from_numpy(wiki_windows[:2])
    else:
        model, ids = _tiny_llama(tiny_dirs, experts=4, top_k=2), token_windows
    export_model(model, tmp_path / "w")
    full = _staged_at(tmp_path / "w", ids, Placement())
    half = _staged_at(tmp_path / "w", ids, Placement("cpu", "bfloat16"))
    assert full.dtype == torch.float32 and half.dtype == torch.bfloat16
    loader = StageLoader(tmp_path / "w", Placement("cpu", "bfloat16"))
    assert {p.dtype for p in loader.layer(0).block.parameters()} == {torch.bfloat16}
    assert loader.expert(0, 0).w_in.dtype == torch.bfloat16
    scale = full.abs().max()
    assert (half.float() - full).abs().max() <= 0.05 * scale  # bfloat16's 8 bits of mantissa
    assert not torch.equal(half.float(), full)  # it did run at bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present here")
def test_a_gpu_placement_where_torch_sees_no_gpu_is_refused(
    minilm: MoEModel, tmp_path: Path
) -> None:
    from ground.errors import ModelError
    from ground.placement import GPU

    export_model(minilm, tmp_path / "w")
    with pytest.raises(ModelError, match="DEVICE=cuda"):
        StageLoader(tmp_path / "w", GPU)
