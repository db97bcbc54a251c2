"""The Gaussian-process surrogate that screens the ε-greedy candidates (serverless-model.md §8).

The black box's input is Q key-value pairs, a thousand-odd dimensions, but all it passes on to the
planner is the predicted tokens per expert (L x E per learning batch). The surrogate therefore
models the cost as a function of those predicted counts, a space where a GP with a few dozen
observations still generalises, and the sampler evaluates the candidate with the lowest posterior
mean: ε-greedy's exploitation step, with exploration left to the ε draws.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["pick_lowest_mean"]


def pick_lowest_mean(
    seen: np.ndarray, costs: np.ndarray, candidates: np.ndarray, *, seed: int
) -> int:
    """Index of the candidate the GP fitted on (`seen`, `costs`) expects to be cheapest.

    Args:
        seen: (n, d) embeddings of the evaluated trials.
        costs: (n,) their objective values.
        candidates: (c, d) embeddings of the candidates.
        seed: Seeds the optimiser restarts of the kernel's hyperparameters.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    centre, scale = seen.mean(axis=0), seen.std(axis=0)
    scale[scale == 0] = 1.0
    x, xc = (seen - centre) / scale, (candidates - centre) / scale
    dims = seen.shape[1]
    kernel = ConstantKernel(1.0) * RBF(length_scale=np.sqrt(dims)) + WhiteKernel(1e-3)
    gp = GaussianProcessRegressor(kernel, normalize_y=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x, costs)
    return int(np.argmin(gp.predict(xc)))
