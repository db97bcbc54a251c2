"""Quality recovery and quality measurement: shared experts, corrections, output-fitted routers,
adaptive k, and the metrics against the dense model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ground.errors import UsageError
from moe import (
    MoefyOptions,
    dense_reference,
    export_model,
    load_corpus,
    load_model,
    make_windows,
    measure_quality,
    moefy_options,
    parse_top_k,
    run_staged,
)
from moe._experts import Router, adaptive_keep, routing_shards
from moe._moefy import _output_target
from moe._options import TopK
from moelambda.cli import app

TOL = 1e-5
runner = CliRunner()


def test_top_k_spellings() -> None:
    assert parse_top_k("2") == TopK(k=2)
    assert parse_top_k("adaptive:0.1") == TopK(rule="gap", k=2, threshold=0.1)
    assert parse_top_k("mass:0.6", experts=8) == TopK(rule="mass", k=8, threshold=0.6)
    assert parse_top_k("mass:0.6:3") == TopK(rule="mass", k=3, threshold=0.6)
    for rule in (
        TopK(k=3),
        TopK(rule="gap", k=2, threshold=0.25),
        TopK(rule="mass", k=4, threshold=0.5),
    ):
        assert parse_top_k(rule.label(), experts=8) == rule
    for bad in ("0", "two", "adaptive:1.5", "mass:0", "mass:2", "adaptive:0.1:3"):
        with pytest.raises(UsageError):
            parse_top_k(bad, experts=8)
    with pytest.raises(UsageError, match="larger than --experts"):
        moefy_options(4, "5")
    with pytest.raises(UsageError, match="not supported"):
        moefy_options(3, "1")


def test_options_round_trip() -> None:
    options = moefy_options(8, "mass:0.5", shared=0.25, router="output", correction=True)
    assert MoefyOptions.from_description(options.describe()) == options
    assert not options.is_original and moefy_options(4, 2).is_original


def test_adaptive_rules_keep_the_right_experts() -> None:
    top_p = torch.tensor([[0.50, 0.45, 0.05], [0.80, 0.15, 0.05], [0.40, 0.35, 0.25]])
    gap = adaptive_keep(top_p[:, :2], TopK(rule="gap", k=2, threshold=0.1))
    assert gap.tolist() == [[True, True], [True, False], [True, True]]
    mass = adaptive_keep(top_p, TopK(rule="mass", k=3, threshold=0.7))
    assert mass.tolist() == [[True, True, False], [True, False, False], [True, True, False]]


def test_unused_slots_are_dropped_by_the_scatter() -> None:
    linear = torch.nn.Linear(6, 4)
    torch.nn.init.normal_(linear.weight, std=3.0)
    router = Router(linear, top_k=TopK(rule="mass", k=4, threshold=0.6), weighting="unit")
    x = torch.randn(200, 6, generator=torch.Generator().manual_seed(0))
    idx, weights, probs = router(x)
    used = idx < 4
    assert used[:, 0].all() and not used.all() and used.sum(1).min() >= 1
    assert torch.equal(weights, used.float()) and (probs[~used] == 0).all()
    shards = routing_shards(idx, weights, 4)
    assert len(shards) == 4 and sum(len(t) for t, _ in shards) == int(used.sum())
    for expert, (tokens, _) in enumerate(shards):
        assert (idx[tokens] == expert).any(dim=1).all()


def test_greedy_output_labels() -> None:
    """Fixed k: each step takes the expert that lowers the squared error most (checked by a
    plain loop); adaptive: each expert's error reduction alone, as a distribution."""
    gen = torch.Generator().manual_seed(3)
    outputs = torch.randn(50, 5, 7, generator=gen)
    residual = outputs[:, [0, 2]].sum(1) + 0.1 * torch.randn(50, 7, generator=gen)
    labels = _output_target(residual, outputs, TopK(k=2))
    for t in range(50):
        taken: list[int] = []
        for _ in range(2):
            rest = [e for e in range(5) if e not in taken]
            err = [(residual[t] - outputs[t, taken + [e]].sum(0)).pow(2).sum() for e in rest]
            taken.append(rest[int(torch.stack(err).argmin())])
        assert sorted(torch.nonzero(labels[t]).flatten().tolist()) == sorted(taken)
    soft = _output_target(residual, outputs, TopK(rule="mass", k=5, threshold=0.5))
    assert torch.allclose(soft.sum(1), torch.ones(50)) and (soft >= 0).all()
    assert (soft[:, [0, 2]].sum(1) > 0.5).float().mean() > 0.9


@pytest.fixture(scope="module")
def recovered(tiny_dirs: dict[str, Path]) -> dict[str, object]:
    path = str(tiny_dirs["llama"])
    common = dict(cache=False, quality_tokens=1024)
    return {
        "plain": load_model(path, experts=4, top_k=1, fit_tokens=512, **common),
        "shared": load_model(path, options=moefy_options(4, 1, shared=0.25), **common),
        "all": load_model(
            path, options=moefy_options(4, 4, shared=0.25, correction=True), **common
        ),
        "recovered": load_model(
            path,
            options=moefy_options(
                4, "mass:0.5", shared=0.25, router="output", correction=True, fit_tokens=512
            ),
            **common,
        ),
    }


def test_every_expert_with_a_shared_expert_and_correction_is_dense(
    recovered: dict, tiny_dirs: dict[str, Path], token_windows: torch.Tensor
) -> None:
    """The shared expert and the experts still partition the FFN, and the correction shrinks
    toward the dense weights: where nothing is missing it is the dense model."""
    from moe._model import load_hf
    from moe._registry import resolve_model

    hf, _ = load_hf(resolve_model(str(tiny_dirs["llama"])))
    with torch.inference_mode():
        expected = hf(token_windows).logits
    assert (recovered["all"].forward(token_windows) - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("name", ["shared", "recovered"])
def test_recovered_stages_equal_monolithic(
    name: str, recovered: dict, token_windows: torch.Tensor, tmp_path: Path
) -> None:
    model = recovered[name]
    reference = model.forward(token_windows, reference=True)
    assert (model.forward(token_windows) - reference).abs().max() <= TOL
    export_model(model, tmp_path / "w")
    assert (run_staged(tmp_path / "w", token_windows) - reference).abs().max() <= TOL
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    assert manifest["moefy"] == model.options.describe()
    assert manifest["quality"] == model.quality


def test_recovery_lowers_the_ffn_error(recovered: dict) -> None:
    plain, best = recovered["plain"].fits, recovered["recovered"].fits
    assert all(b.ffn_rel_error < p.ffn_rel_error for p, b in zip(plain, best, strict=True))


def test_quality_of_the_dense_model_itself(tiny_dirs: dict[str, Path]) -> None:
    """Every expert on every token is the dense model: every measure at its ideal."""
    path = str(tiny_dirs["llama"])
    model = load_model(path, experts=2, top_k=2, fit_tokens=256, cache=False, quality_tokens=0)
    assert model.quality is None
    q = measure_quality(model, dense_reference(path), load_corpus("wiki"), tokens=512, window=32)
    assert q.kind == "decoder" and q.windows == 16 and q.tokens == 512
    assert q.ppl_ratio == pytest.approx(1.0, abs=1e-5) and q.kl_mean == pytest.approx(0, abs=1e-6)
    assert q.next_token_agreement == 1.0 and q.expert_flops_share == 1.0


def test_quality_measures_what_was_routed(recovered: dict, tiny_dirs: dict[str, Path]) -> None:
    plain, best = recovered["plain"].quality, recovered["recovered"].quality
    assert plain["expert_flops_share"] == pytest.approx(0.25)
    # 16 of the 64 neurons shared, 48 routed in 4 experts of 12, one per token: 28 / 64
    assert recovered["shared"].quality["expert_flops_share"] == pytest.approx(28 / 64)
    # adaptive k: at least the shared part plus one expert, and some tokens take more
    assert 28 / 64 < best["expert_flops_share"] < 1.0
    assert best["kl_mean"] < plain["kl_mean"]
    assert plain["ppl_ratio"] != 1.0


def test_quality_command(minilm_e2: None) -> None:
    result = runner.invoke(
        app, ["quality", "--experts", "2", "--top-k", "1", "--tokens", "1024", "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    q = out["quality"]
    assert q["kind"] == "encoder" and q["windows"] == 16 and out["measured_now"]
    assert q["fit_corpus"] == q["corpus"] == "wiki" and q["split"] == "test"
    assert q["fit_corpus_sha256"] == q["corpus_sha256"] == out["moefy"]["fit_corpus_sha256"]
    assert q["expert_flops_share"] == pytest.approx(0.5)
    assert 0 < q["cosine_min"] <= q["cosine_p05"] <= q["cosine_mean"] < 1
    assert 0 <= q["neighbour_overlap_10"] <= 1


@pytest.fixture()
def minilm_e2() -> None:
    """MiniLM E=2 k=1 in the test cache (converted once per session by whichever test asks)."""
    load_model("minilm", experts=2, top_k=1)


def test_quality_refuses_a_native_model(tiny_dirs: dict[str, Path]) -> None:
    result = runner.invoke(app, ["quality", "--model", str(tiny_dirs["olmoe"])])
    assert result.exit_code == 2
    assert "native MoE model" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["quality", "--top-k", "adaptive:2"])
    assert result.exit_code == 2 and "between 0 and 1" in result.output


def test_greedy_is_exhaustive_for_one_expert() -> None:
    gen = torch.Generator().manual_seed(5)
    outputs = torch.randn(30, 4, 3, generator=gen)
    residual = torch.randn(30, 3, generator=gen)
    labels = _output_target(residual, outputs, TopK(k=1))
    for t in range(30):
        errs = [(residual[t] - outputs[t, e]).pow(2).sum() for e in range(4)]
        assert int(labels[t].argmax()) == int(torch.stack(errs).argmin())


def test_distillation_lowers_its_loss_and_keeps_the_stages_exact(
    tiny_dirs: dict[str, Path], token_windows: torch.Tensor, tmp_path: Path
) -> None:
    from moe._distil import distil
    from moe._families import family_for
    from moe._model import load_hf
    from moe._registry import resolve_model

    path = str(tiny_dirs["llama"])
    model = load_model(path, experts=4, top_k=1, fit_tokens=512, cache=False, quality_tokens=0)
    hf, tokenizer = load_hf(resolve_model(path))
    family = family_for(hf)
    windows = torch.from_numpy(
        make_windows(load_corpus("wiki"), tokenizer, tokens=1024, window=16, seed=0)
    )
    before = model.banks[0].w_in.clone()
    run = distil(model, family.parts_from_hf(hf), windows, steps=40)
    assert np.mean(run.losses[-10:]) < np.mean(run.losses[:10])
    assert run.kept_step == 40 and not run.validation  # no validation text: the last step
    assert not torch.equal(before, model.banks[0].w_in)
    assert not model.banks[0].w_in.requires_grad  # frozen again for serving
    reference = model.forward(token_windows, reference=True)
    export_model(model, tmp_path / "w")
    assert (run_staged(tmp_path / "w", token_windows) - reference).abs().max() <= TOL


def test_distillation_keeps_the_experts_of_its_lowest_validation_loss(
    tiny_dirs: dict[str, Path],
) -> None:
    """A learning rate far too high makes training diverge: the kept experts are those of the
    best validation check (here before training), not the last step's."""
    from moe import _distil
    from moe._families import family_for
    from moe._model import load_hf
    from moe._registry import resolve_model

    path = str(tiny_dirs["llama"])
    model = load_model(path, experts=4, top_k=1, fit_tokens=512, cache=False, quality_tokens=0)
    hf, tokenizer = load_hf(resolve_model(path))
    parts = family_for(hf).parts_from_hf(hf)
    corpus = load_corpus("wiki")
    # 16-token windows: a step's cost is its windows' logits over the 30,522-token vocabulary.
    train = torch.from_numpy(make_windows(corpus, tokenizer, tokens=1024, window=16, seed=0))
    held = torch.from_numpy(
        make_windows(corpus, tokenizer, tokens=256, window=16, seed=0, split="validation")
    )
    before = [b.w_in.clone() for b in model.banks]
    lr = _distil.LEARNING_RATE
    _distil.LEARNING_RATE = 10.0
    try:
        run = _distil.distil(model, parts, train, steps=20, validation=held)
    finally:
        _distil.LEARNING_RATE = lr
    losses = dict(run.validation)
    assert len(losses) == _distil.VALIDATION_CHECKS + 1 and 0 in losses
    assert losses[run.kept_step] == min(losses.values())
    assert losses[20] > losses[run.kept_step]  # the last step was not the best
    if run.kept_step == 0:
        assert all(torch.equal(b, a.w_in) for b, a in zip(before, model.banks, strict=True))


def test_every_model_is_judged_only_on_its_test_part(tiny_dirs: dict[str, Path]) -> None:
    """Not only distilled models, and with any seed: the test part is the same documents for
    every seed, so a model fitted with seed 0 and judged with seed 1 reads no fit text."""
    from moe import QUALITY_WINDOW, TEST_TOKENS, quality_of

    model = load_model(
        str(tiny_dirs["llama"]),
        experts=4,
        top_k=1,
        fit_tokens=512,
        cache=False,
        quality_tokens=1024,
    )
    assert model.quality is not None and model.quality["split"] == "test"
    with pytest.raises(UsageError, match="no fit or choice reads"):
        quality_of(model, tokens=TEST_TOKENS)
    stored, measured_now = quality_of(model, tokens=1024)
    assert not measured_now and stored.tokens == 1024
    other, measured_now = quality_of(model, tokens=1024, seed=model.seed + 1)
    assert measured_now and other.split == "test" and other.seed == model.seed + 1
    validation, _ = quality_of(model, tokens=1024, split="validation")
    assert validation.split == "validation" and validation != stored
    assert TEST_TOKENS - QUALITY_WINDOW >= 16_384  # the default comparison stays allowed


def test_too_many_fit_tokens_are_refused_before_the_weights_load(
    tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ground.errors import CorpusError
    from moe import _model

    def no_weights(*_: object, **__: object) -> None:
        raise AssertionError("the weights were loaded before the text was checked")

    monkeypatch.setattr(_model, "load_hf", no_weights)
    with pytest.raises(CorpusError, match="fit part") as refused:
        load_model(str(tiny_dirs["llama"]), experts=4, top_k=1, fit_tokens=3_000_000, cache=False)
    assert "--fit-tokens" in (refused.value.fix or "")


def test_neighbour_overlap_of_a_hand_built_case() -> None:
    """Five directions in the plane. Dense angles 0, 10, 25, 90, 100 degrees: nearest of each is
    1, 0, 1, 4, 3. Moving the second to 20 degrees makes its nearest 2 (5 degrees away, not
    0): one row of five loses its neighbour, so the overlap is 4/5. With k = 2 the rows keep
    {1,2}->{1,2}, {0,2}->{0,2}, {1,0}->{1,0}, {4,2}->{4,2}, {3,2}->{3,2}: all of them."""
    from moe._quality import _neighbour_overlap

    def at(degrees: list[float]) -> torch.Tensor:
        rad = torch.deg2rad(torch.tensor(degrees, dtype=torch.float64))
        return torch.stack([rad.cos(), rad.sin()], dim=1)

    dense, moe = at([0, 10, 25, 90, 100]), at([0, 20, 25, 90, 100])
    assert _neighbour_overlap(dense, moe, 1) == pytest.approx(0.8)
    assert _neighbour_overlap(dense, moe, 2) == pytest.approx(1.0)
    # At 0, 50, 100, 10, 60 degrees the nearest are 3, 4, 4, 0, 1: none of the dense ones.
    assert _neighbour_overlap(dense, at([0, 50, 100, 10, 60]), 1) == pytest.approx(0.0)
    assert _neighbour_overlap(dense[:1], moe[:1], 10) == 1.0  # no other row to compare
