"""Real against predicted expert popularity, one panel per MoE layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ground.files import write_file_atomically

__all__ = ["plot_counts"]


def plot_counts(
    path: Path,
    real: np.ndarray,
    predicted: dict[str, np.ndarray],
    *,
    title: str,
    force: bool = False,
) -> None:
    """Grouped bars per expert: the real count, then each method's prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, experts = real.shape
    cols = min(3, layers)
    rows = -(-layers // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False, sharey=True
    )
    series = {"real": real, **predicted}
    width = 0.8 / len(series)
    x = np.arange(experts)
    for layer, ax in enumerate(axes.flat):
        if layer >= layers:
            ax.axis("off")
            continue
        for i, (name, counts) in enumerate(series.items()):
            ax.bar(x + (i - (len(series) - 1) / 2) * width, counts[layer], width, label=name)
        ax.set_title(f"layer {layer}")
        ax.set_xticks(x, [f"e{e}" for e in range(experts)])
        if layer % cols == 0:
            ax.set_ylabel("tokens")
    axes.flat[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110), force=force)
    finally:
        plt.close(fig)
