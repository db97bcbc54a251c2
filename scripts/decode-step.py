"""Measure a decode step's floor per layer: the seconds one layer of a small-batch decode step
takes beyond what the per-token compute model (U_j, measured on 1,024-token batches) predicts.

It generates with the MoEfied SmolLM2 (E = 8, k = 4, correction; cached after the first run) in
this process, on one torch thread, for one sequence and for eight, and prints the time per
output token over the number of layers: the calibration's `decode_layer_floor_s`.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/decode-step.py [--dry-run]

`--dry-run` names what would be measured and loads nothing.
"""

from __future__ import annotations

import sys


def main() -> None:
    if "--dry-run" in sys.argv[1:]:
        print(
            "decode_layer_floor_s: would time the MoEfied SmolLM2 (E = 8, k = 4, correction) "
            "generating 33 tokens for 1 and 8 sequences on one torch thread, per output token "
            "and layer (dry run: nothing measured)"
        )
        return
    import torch

    from moe import GenerationConfig, MoefyOptions, load_model
    from moe._options import parse_top_k

    torch.set_num_threads(1)
    options = MoefyOptions(experts=8, top_k=parse_top_k("4", 8), correction=True, seed=0)
    model = load_model("smollm2", options=options)
    prompt = model.tokenizer("The capital of France is")["input_ids"]
    model.generate([prompt], GenerationConfig(max_new_tokens=4))  # warm up
    for sequences in (1, 8):
        out = model.generate([prompt] * sequences, GenerationConfig(max_new_tokens=33))
        tpot = out[0].tpot_s or 0.0
        print(
            f"{sequences} sequence(s): TPOT {tpot * 1000:.1f} ms, "
            f"{tpot / model.num_layers * 1000:.2f} ms per layer ({model.num_layers} layers)"
        )


if __name__ == "__main__":
    main()
