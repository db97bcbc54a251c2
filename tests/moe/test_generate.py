"""Generation in process: the KV-cache decode loop against Hugging Face `generate` (native MoE
models, and a MoEfied model with every expert selected) and against decoding without a cache
(a MoEfied model with real routing); sampling and stopping."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe import GenerationConfig, MoEModel, load_model
from moe._model import load_hf
from moe._registry import resolve_model

PROMPTS = [[5, 1000, 2000, 3000, 4000, 17], [2500, 7], [100, 200, 300, 400]]


def _hf_greedy(path: str, prompts: list[list[int]], new: int, eos: int | None = None) -> list:
    """Hugging Face's greedy decode of the left-padded batch, new tokens per prompt (cut after
    an end-of-sequence token, as `generate` pads after it)."""
    hf, _ = load_hf(resolve_model(path))
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = torch.tensor(prompt)
        mask[b, width - len(prompt) :] = 1
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=eos,
        )
    result = []
    for row in out[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        result.append(row)
    return result


def _assert_greedy_without_cache(model: MoEModel, prompt: list[int], got: list[int]) -> None:
    """`got` is what a greedy decode of one prompt gives when it recomputes the whole sequence
    every step (no cache, no padding, the plain forward pass), fed `got` itself.

    Where the top logits tie (the tiny random model has exact ties; 1e-4 covers float32's
    noise between the two ways of computing them), either token is a greedy answer: `got`'s
    token must be one of the tied ones (the smallest gap between untied top logits here: 0.017)."""
    ids = list(prompt)
    for step, token in enumerate(got):
        logits = model.forward(torch.tensor([ids]))[0, -1]
        best = logits.max()
        tied = torch.nonzero(logits >= best - 1e-4).flatten().tolist()
        assert token in tied, (step, token, tied)
        ids.append(token)


@pytest.mark.parametrize("kind", ["mixtral", "olmoe"])
def test_native_moe_decodes_as_hugging_face_generate(
    kind: str, tiny_dirs: dict[str, Path]
) -> None:
    model = load_model(str(tiny_dirs[kind]), experts=None, top_k=None)
    got = model.generate(PROMPTS, GenerationConfig(max_new_tokens=20))
    expected = _hf_greedy(str(tiny_dirs[kind]), PROMPTS, 20)
    assert [g.token_ids for g in got] == expected
    assert len({tuple(e) for e in expected}) == len(PROMPTS)  # not one degenerate answer
    assert all(g.finish_reason == "length" and g.ttft_s > 0 for g in got)


@pytest.mark.slow  # the real 30-layer SmolLM2: 64 tokens against Hugging Face
def test_smollm2_with_every_expert_generates_what_the_dense_model_generates() -> None:
    """E = k = 2: every expert on every token with unit weights is the dense FFN; 64 greedy
    tokens for three prompts of different lengths, batched, equal Hugging Face's."""
    model = load_model("smollm2", experts=2, top_k=2, fit_tokens=512, quality_tokens=0)
    texts = ["The capital of France is", "Once upon a time, in a small village", "def f(n):"]
    prompts = [model.tokenizer(t)["input_ids"] for t in texts]
    got = model.generate(prompts, GenerationConfig(max_new_tokens=64))
    eos = model.family.config.eos_token_id
    assert [g.token_ids for g in got] == _hf_greedy("smollm2", prompts, 64, eos)
    assert "Paris" in got[0].text


def test_routed_moefied_decode_with_cache_equals_decode_without(
    tiny_dirs: dict[str, Path],
) -> None:
    """Real top-2 routing of 4 experts: the cached, padded, batched loop gives each prompt what
    recomputing its own sequence every step gives."""
    # No quality measurement (nothing here reads it): on the default 16,384 held-out tokens
    # over a 30,522-word vocabulary it is most of the conversion's time.
    model = load_model(
        str(tiny_dirs["llama"]), experts=4, top_k=2, fit_tokens=256, quality_tokens=0
    )
    got = model.generate(PROMPTS, GenerationConfig(max_new_tokens=12))
    for prompt, g in zip(PROMPTS, got, strict=True):
        assert len(g.token_ids) == 12
        _assert_greedy_without_cache(model, prompt, g.token_ids)


def test_sampling_is_seeded_and_top_p_near_zero_is_greedy(tiny_dirs: dict[str, Path]) -> None:
    model = load_model(str(tiny_dirs["mixtral"]), experts=None, top_k=None)

    def ids(**settings: float) -> list[list[int]]:
        config = GenerationConfig(max_new_tokens=10, **settings)
        return [g.token_ids for g in model.generate(PROMPTS, config)]

    greedy = ids()
    assert ids(temperature=1.0, seed=3) == ids(temperature=1.0, seed=3)
    assert ids(temperature=1.0, seed=3) != ids(temperature=1.0, seed=4)
    assert ids(temperature=1.0, seed=3) != greedy
    assert ids(temperature=1.0, top_p=1e-9, seed=5) == greedy


def test_a_stop_string_ends_a_sequence_and_is_cut_from_its_text(
    tiny_dirs: dict[str, Path],
) -> None:
    model = load_model(str(tiny_dirs["mixtral"]), experts=None, top_k=None)
    (free,) = model.generate([PROMPTS[0]], GenerationConfig(max_new_tokens=12))
    words = free.text.split()
    stop = words[2]
    (stopped,) = model.generate([PROMPTS[0]], GenerationConfig(max_new_tokens=12, stop=(stop,)))
    assert stopped.finish_reason == "stop"
    assert len(stopped.token_ids) < len(free.token_ids)
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert stop not in stopped.text and free.text.startswith(stopped.text)


def test_an_end_of_sequence_token_ends_only_its_sequence(tiny_dirs: dict[str, Path]) -> None:
    model = load_model(str(tiny_dirs["olmoe"]), experts=None, top_k=None)
    free = model.generate(PROMPTS, GenerationConfig(max_new_tokens=10))
    eos = free[1].token_ids[3]  # the second prompt's fourth token ends it
    model.family.config.eos_token_id = eos
    try:
        ended = model.generate(PROMPTS, GenerationConfig(max_new_tokens=10))
    finally:
        model.family.config.eos_token_id = None
    assert ended[1].token_ids == free[1].token_ids[:4] and ended[1].finish_reason == "eos"
    for b in (0, 2):  # the others go on, unchanged, unless they meet the same token
        if eos not in free[b].token_ids:
            assert ended[b].token_ids == free[b].token_ids


def test_an_encoder_refuses_to_generate(minilm: MoEModel) -> None:
    from ground.errors import UsageError

    with pytest.raises(UsageError, match="encoder"):
        minilm.generate([[101, 2023]], GenerationConfig(max_new_tokens=2))
