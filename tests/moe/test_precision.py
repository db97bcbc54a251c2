"""Weight precisions: the int8 kernel and its stored form, a model at a precision, its export,
the stages the functions build from it, and the hardware checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ground.errors import UsageError
from ground.precision import Weights, parse_weights
from moe import (
    MoEModel,
    StageLoader,
    at_precision,
    check_precision,
    export_model,
    load_exported,
    local_experts,
    run_stages,
)
from moe._int8 import Int8Embedding, Int8Linear, Int8Matrix, int8_shells, quantize_stack
from tests.moe.test_stages import _tiny_llama


def _staged(root: Path, ids: torch.Tensor) -> torch.Tensor:
    loader = StageLoader(root)
    m = loader.manifest
    return run_stages(
        loader, m.num_layers, ids, local_experts(loader.expert, m.experts, m.hidden_size)
    )


# ---------------------------------------------------------------- the spelling of --weights


@pytest.mark.parametrize(
    ("spec", "stack", "experts", "label"),
    [
        ("int8", "int8", "int8", "int8"),
        ("BF16", "bf16", "bf16", "bf16"),
        ("experts=int8", "fp32", "int8", "stack=fp32,experts=int8"),
        ("stack=bf16,experts=int8", "bf16", "int8", "stack=bf16,experts=int8"),
        ("stack=int8,experts=int8", "int8", "int8", "int8"),
    ],
)
def test_weights_are_read_per_stage_kind(spec: str, stack: str, experts: str, label: str) -> None:
    weights = parse_weights(spec)
    assert (weights.stack, weights.experts) == (stack, experts)
    assert weights.label() == label
    assert parse_weights(weights.label()) == weights


@pytest.mark.parametrize(
    ("spec", "names"),
    [("fp16", "fp32, bf16, int8"), ("layers=int8", "stack"), ("experts=int4", "fp32, bf16")],
)
def test_an_unknown_precision_or_stage_kind_names_the_fix(spec: str, names: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_weights(spec)
    assert names in caught.value.fix or names in caught.value.problem


def test_sizes_per_stage_kind_follow_the_precision() -> None:
    weights = parse_weights("stack=bf16,experts=int8")
    assert [weights.bytes_per_weight(r) for r in ("head", "layer", "expert", "tail")] == [
        2,
        2,
        1,
        2,
    ]
    assert weights.wire_bytes() == 2 and weights.expert_wire_bytes() == 2
    assert parse_weights("int8").wire_bytes() == 4  # int8 stages compute in float32


# ---------------------------------------------------------------- the int8 kernel


def test_an_int8_matrix_is_within_half_a_step_of_its_weights_and_stores_exactly() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 40, generator=g), torch.randn(48, generator=g)
    w[3] = 0.0  # a zero row must not divide by zero
    m = Int8Matrix.quantize(w, b)  # 40 inputs: not a width the weight-only kernel reads
    values, scale, bias = m.stored()
    assert values.dtype == torch.int8 and values.abs().max() <= 127
    assert torch.equal(values[3], torch.zeros(40, dtype=torch.int8))
    step = scale[:, None].expand_as(w)
    assert ((m.dequantized() - w).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(bias, b)
    again = Int8Matrix(values, scale, bias)  # what a function loads from the file
    x = torch.randn(2, 5, 40, generator=g)
    assert torch.equal(again(x), m(x))
    exact = torch.nn.functional.linear(x, w, b)
    # the error of an int8 product: the weights' and the activations' rounding
    assert (m(x) - exact).abs().max() <= 0.05 * exact.abs().max()
    assert m(x).shape == (2, 5, 48) and m(torch.zeros(0, 40)).shape == (0, 48)
    assert m(x.bfloat16()).dtype == torch.bfloat16
    # the same at a width the weight-only kernel reads (few rows) and the widened GEMM (many)
    m = Int8Matrix.quantize(w[:, :32], b)
    for rows in (1, 3, 40):
        x = torch.randn(rows, 32, generator=g)
        exact = torch.nn.functional.linear(x, w[:, :32], b)
        assert (m(x) - exact).abs().max() <= 0.05 * exact.abs().max()


def test_int8_layers_round_trip_through_their_state_dict() -> None:
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 8))
    ids = torch.tensor([[1, 7, 49]])
    reference = block(ids)
    quantize_stack(block)
    assert isinstance(block[0], Int8Embedding) and isinstance(block[1], Int8Linear)
    state = block.state_dict()
    assert state["1.weight"].dtype == torch.int8 and state["0.weight"].dtype == torch.int8
    assert set(state) == {"0.weight", "0.weight_scale", "1.weight", "1.weight_scale", "1.bias"}
    empty = int8_shells(torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 8)))
    empty.load_state_dict(state, strict=True)
    assert torch.equal(empty(ids), block(ids))
    assert (block(ids) - reference).abs().max() < 0.05 * reference.abs().max()
    with pytest.raises(RuntimeError, match="Missing"):
        int8_shells(torch.nn.Sequential(torch.nn.Linear(16, 8))).load_state_dict({})


def test_the_int8_kernels_compute_the_same_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few rows take the weight-only int8 GEMM, many the widened bfloat16 one, and a CPU
    without bfloat16 the portable one: the same product of the same scaled values, to
    bfloat16 rounding."""
    from moe._int8 import FEW_ROWS, KERNEL_ENV

    monkeypatch.setenv(KERNEL_ENV, "bf16")
    g = torch.Generator().manual_seed(3)
    m = Int8Matrix.quantize(torch.randn(64, 96, generator=g), torch.randn(64, generator=g))
    assert torch.equal(m.scale.bfloat16().float(), m.scale)  # one scale for both kernels
    x = torch.randn(4 * FEW_ROWS, 96, generator=g)
    many = m(x)
    few = torch.cat([m(x[i : i + FEW_ROWS]) for i in range(0, x.shape[0], FEW_ROWS)])
    assert (few - many).abs().max() <= 2e-2 * many.abs().max()  # bfloat16 output rounding
    exact = x.bfloat16().float() @ m.dequantized().T + m.bias
    assert (many - exact).abs().max() <= 1e-2 * exact.abs().max()
    monkeypatch.setenv(KERNEL_ENV, "portable")
    portable = m(x)
    assert torch.allclose(portable, x @ m.dequantized().T + m.bias, rtol=1e-5, atol=1e-5)
    assert (portable - many).abs().max() <= 1e-2 * many.abs().max()
    monkeypatch.setenv(KERNEL_ENV, "int4")
    with pytest.raises(ValueError, match="bf16 or portable"):
        m(x)


# ---------------------------------------------------------------- a model at a precision


@pytest.fixture(scope="module")
def llama(tiny_dirs: dict[str, Path]) -> MoEModel:
    return _tiny_llama(tiny_dirs, experts=4, top_k=2)


@pytest.mark.parametrize("spec", ["int8", "stack=fp32,experts=int8", "bf16"])
@pytest.mark.parametrize("which", ["minilm", "llama"])
def test_the_export_at_a_precision_serves_the_in_process_model(
    spec: str,
    which: str,
    minilm: MoEModel,
    llama: MoEModel,
    wiki_windows: np.ndarray,
    token_windows: torch.Tensor,
    tmp_path: Path,
) -> None:
    """Stages built from the export, as the functions build them, equal the model converted in
    this process (the float32 model itself is untouched), and the files shrink with it."""
    if "bf16" in spec and check_bf16() is None:
        pytest.skip("this CPU has no bfloat16 instructions")
    model, ids = (
        (minilm, torch.from_numpy(wiki_windows[:2]))
        if which == "minilm"
        else (
            llama,
            token_windows,
        )
    )
    weights = parse_weights(spec)
    before = model.forward(ids)
    converted = at_precision(model, weights)
    assert converted.weights == weights and converted.quality is None
    assert torch.equal(model.forward(ids), before)
    expected = converted.forward(ids).float()
    manifest = export_model(converted, tmp_path / "w")
    assert manifest.weights == weights.label() and manifest.precision == weights
    staged = _staged(tmp_path / "w", ids).float()
    scale = expected.abs().max()
    assert (staged - expected).abs().max() <= 1e-4 * scale  # the same weights, the same kernel
    few = ids[:1, :8]  # a few rows: int8's weight-only kernel, on weights read from the files
    assert torch.equal(_staged(tmp_path / "w", few).float(), converted.forward(few).float())
    if which == "minilm":  # real weights (the tiny model's random ones flip routing)
        assert (expected - before).abs().max() <= 0.1 * scale  # near the float32 model
    assert not torch.equal(expected, before)  # and not it
    full = export_model(model, tmp_path / "fp32")
    for role in ("layer", "expert"):
        got = sum(s.bytes for s in manifest.stages if s.role == role)
        was = sum(s.bytes for s in full.stages if s.role == role)
        ratio = weights.bytes_per_weight(role) / 4
        # int8 adds a float32 scale per row, and gates and norms stay float32: a few percent
        # of MiniLM's stages, much more of the tiny model's rows of 32 values
        slack = 0.05 if which == "minilm" else 0.6
        assert ratio <= got / was <= ratio * (1 + slack)
    reloaded = load_exported(tmp_path / "w")
    assert reloaded.weights == weights
    assert torch.equal(reloaded.forward(ids).float(), expected)


def check_bf16() -> str | None:
    from moe import cpu_bf16

    return cpu_bf16()


def test_a_bf16_stack_keeps_its_gate_in_float32(
    llama: MoEModel, token_windows: torch.Tensor, tmp_path: Path
) -> None:
    if check_bf16() is None:
        pytest.skip("this CPU has no bfloat16 instructions")
    converted = at_precision(llama, parse_weights("bf16"))
    assert converted.routers[0].linear.weight.dtype == torch.float32
    assert {p.dtype for p in converted.blocks[0].parameters()} == {torch.bfloat16}
    export_model(converted, tmp_path / "w")
    loader = StageLoader(tmp_path / "w")
    stage = loader.layer(1)
    assert stage.router.linear.weight.dtype == torch.float32
    assert {p.dtype for p in stage.block.parameters()} == {torch.bfloat16}
    assert loader.expert(0, 0).w_in.dtype == torch.bfloat16  # type: ignore[union-attr]


def test_a_precision_is_applied_to_the_float32_model_once(llama: MoEModel) -> None:
    converted = at_precision(llama, parse_weights("int8"))
    assert at_precision(converted, parse_weights("int8")) is converted
    with pytest.raises(UsageError, match="already at --weights int8"):
        at_precision(converted, parse_weights("experts=int8"))


def test_bf16_on_a_cpu_without_it_and_int8_on_a_gpu_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import moe._placement as precision
    from ground.placement import GPU

    monkeypatch.setattr(precision, "cpu_bf16", lambda: None)
    with pytest.raises(UsageError, match="no bfloat16 instructions"):
        check_precision(parse_weights("stack=bf16"))
    assert check_precision(parse_weights("int8")) == parse_weights("int8")  # any CPU
    with pytest.raises(UsageError, match="CPUs only"):
        check_precision(parse_weights("experts=int8"), GPU)
    assert check_precision(Weights(), GPU) == Weights()
