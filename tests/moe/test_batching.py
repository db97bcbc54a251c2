"""Continuous batching in process: sequences that join and leave a running batch between steps
get the tokens they get decoded alone, greedy and sampled; the batch's cache keeps only what its
running sequences use; streamed text is always a prefix of the final text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe import ContinuousBatch, GenerationConfig, TextStream, eos_ids, load_model


def _requests(count: int) -> tuple[list[list[int]], list[GenerationConfig]]:
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 40, (count,), generator=g).tolist()
    prompts = [torch.randint(10, 1000, (n,), generator=g).tolist() for n in lengths]
    new = torch.randint(1, 25, (count,), generator=g).tolist()
    configs = [
        GenerationConfig(max_new_tokens=n, temperature=0.8 if i % 5 == 4 else 0.0, seed=i)
        for i, n in enumerate(new)
    ]
    return prompts, configs


def test_sequences_joining_a_running_batch_get_what_they_get_alone(
    tiny_dirs: dict[str, Path],
) -> None:
    model = load_model(str(tiny_dirs["mixtral"]), experts=None, top_k=None)
    prompts, configs = _requests(16)
    # One of request 0's greedy tokens joins the model's EOS ids, so some sequence ends on an
    # EOS on every machine, not only where a sampled row happens to draw one.
    cfg = model.family.config
    cfg.eos_token_id = eos_ids(cfg) + [model.generate([prompts[0]], configs[0])[0].token_ids[2]]
    alone = [model.generate([p], c)[0] for p, c in zip(prompts, configs, strict=True)]
    batch = ContinuousBatch(
        model.stages(),
        model.num_layers,
        model.expert_call(),
        slots=5,
        pad_id=0,
        eos_ids=eos_ids(model.family.config),  # as the worker: a sampled EOS ends a sequence
        prefill_chunk_tokens=7,  # prompts up to 39 tokens: up to 6 chunks each
    )
    got: dict[str, list[int]] = {}
    ended: dict[str, str] = {}
    waiting, iteration, widest = list(range(16)), 0, 0
    while waiting or batch.busy:
        while waiting and batch.free and iteration >= 2 * waiting[0]:  # one every 2 steps
            k = waiting.pop(0)
            batch.admit(str(k), prompts[k], configs[k])
        for e in batch.step():
            got.setdefault(e.key, []).append(e.token)
            assert e.index == len(got[e.key]) - 1
            if e.finish_reason is not None:
                ended[e.key] = e.finish_reason
        assert batch.decoding <= 5 and batch.free >= 0
        widest = max(widest, batch.decoding)
        iteration += 1
    assert [got[str(k)] for k in range(16)] == [a.token_ids for a in alone]
    assert [ended[str(k)] for k in range(16)] == [a.finish_reason for a in alone]
    assert "eos" in ended.values()
    assert len(ended) == 16 and widest == 5  # every slot was used at once
    assert batch.cache is None and batch.valid.shape == (0, 0)  # nothing held after the last


def test_the_cache_drops_finished_rows_and_unused_columns(tiny_dirs: dict[str, Path]) -> None:
    model = load_model(str(tiny_dirs["mixtral"]), experts=None, top_k=None)
    batch = ContinuousBatch(
        model.stages(), model.num_layers, model.expert_call(), slots=2, pad_id=0
    )
    batch.admit("long", list(range(10, 40)), GenerationConfig(max_new_tokens=3))
    batch.admit("short", [5, 6, 7], GenerationConfig(max_new_tokens=6))
    got = batch.step()  # the long prompt's prefill (its first token), then its decode step
    assert [(e.key, e.index) for e in got] == [("long", 0), ("long", 1)]
    batch.step()  # the short prompt joins, right-aligned; long's last token: its row goes
    assert [s.key for s in batch.running] == ["short"]
    # short's 3 prompt columns and its first decode column remain, the long ones trimmed
    assert batch.valid.shape == (1, 4) and bool(batch.valid.all())
    assert batch.cache.layers[0].keys.shape[0] == 1
    assert batch.cache.layers[0].keys.shape[2] == 4


def test_admission_is_refused_past_the_slots_and_for_a_held_key(
    tiny_dirs: dict[str, Path],
) -> None:
    model = load_model(str(tiny_dirs["mixtral"]), experts=None, top_k=None)
    batch = ContinuousBatch(
        model.stages(), model.num_layers, model.expert_call(), slots=1, pad_id=0
    )
    batch.admit("a", [1, 2], GenerationConfig())
    with pytest.raises(ValueError, match="no free slot"):
        batch.admit("b", [1, 2], GenerationConfig())
    batch = ContinuousBatch(
        model.stages(), model.num_layers, model.expert_call(), slots=2, pad_id=0
    )
    batch.admit("a", [1, 2], GenerationConfig())
    with pytest.raises(ValueError, match="already held"):
        batch.admit("a", [3], GenerationConfig())
    with pytest.raises(ValueError, match="at least one token"):
        batch.admit("c", [], GenerationConfig())


class _Words:
    """A tokenizer whose ids are words and punctuation, cleaned up as GPT-2's is: " ." -> "."."""

    vocab = ["Hello", " world", " .", " again", "\ufffd", " stop", "!"]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = "".join(self.vocab[i] for i in ids)
        return text.replace(" .", ".")


@pytest.mark.parametrize("stop", [(), (" stop",)])
def test_streamed_text_is_always_a_prefix_of_the_final_text(stop: tuple[str, ...]) -> None:
    tokens = _Words()
    ids = [0, 1, 2, 3, 4, 6, 1, 5, 6]
    stream = TextStream(tokens, stop)
    sent = "".join(stream.delta(ids[: i + 1]) for i in range(len(ids)))
    final = tokens.decode(ids)
    if stop:
        final = final[: final.find(stop[0])]
    assert final.startswith(sent) and sent  # something streamed, never more than the answer
    assert sent + stream.rest(final) == final
