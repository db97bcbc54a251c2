"""Problem (12) as a mixed-integer linear program, solved by HiGHS or, with a licence, Gurobi.

Notation (serverless-model.md §4-§5). A *block* is one layer l under one variant v = (method a,
pipeline degree beta); every method except PIPELINED has the single variant beta = 1.

Variables:
    z[l,v] in {0,1}   the layer uses variant v (omitted, i.e. 1, when the layer has one variant);
    w[l,v,e,k] in {0,1}  expert e takes option k = (memory j, replicas g) in block (l,v). The
        paper's product x[e,j] * y[e,g] of two one-hot binaries is linearised exactly by one
        binary per (j,g) pair, so no quadratic term remains;
    phi[l,c] >= 0     slowest finish of layer l's chosen variant, one column per class c of
        variants that cost the same per second of latency (`layer_terms`: a direct gate waits
        for its experts; Express bills duration); an unchosen class's phi falls to 0.

Constraints:
    sum_k w[l,v,e,k] = z[l,v]                for every block and expert (one option if chosen);
    sum_v z[l,v] = 1                         one variant per layer;
    phi[l,c] >= sum_k finish[k] w[l,v,e,k]   per block of class c and expert (max linearised, phi
        is pushed up only by the chosen block because the others have w = 0);
    fixed + sum_l sum_c phi[l,c] <= SLO      (12d).

Objective: sum cost[k] w[l,v,e,k] + sum usd[l,v] z[l,v] + sum per_s[l,c] phi[l,c]: the full bill
(or the experts' cost), as `evaluate` prices it, scaled to O(1) for the solver.

Cuts (valid, so the optimum is unchanged): the per-expert rows let the LP relaxation meet the
SLO with each expert's *mean* finish, a weak bound at tight SLOs. `_level_rows` adds, per layer
and class, continuous u_t over the distinct finish levels with
sum_{k: finish_k >= T_t} w_k <= u_t, which makes phi at least the LP's max over experts of the
probability of reaching each level. On the paper-size instance they cut the gap at a tight SLO
from ~30 % to ~1 % within 60 s.

Exact reductions before the model is built:
* only feasible options enter (12c and the payload limit);
* finish times are raised to the block's floor (`_block`) and an option that another option
  of the same expert and block matches or beats in cost and finish is dropped;
* a variant (beta) whose every option is covered by another variant's is dropped
  (`_undominated_blocks`): small betas pay T^dl per minibatch and lose outright.
Swapping a dropped option or variant for the one that covers it never breaks a constraint nor
raises the cost, so the optimum is unchanged while paper-size models shrink ~4-fold.

The solver starts from the fastest deployment (`_fastest_start`), feasible whenever any is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from ground.errors import UsageError, did_you_mean
from planner.costmodel import (
    Choice,
    Solution,
    evaluate,
    expert_options,
    layer_terms,
)
from planner.instance import Instance, Method
from planner.milp_backends import Backend, run

__all__ = ["Backend", "solve_milp", "solve_milp_mixed"]


@dataclass(frozen=True, eq=False)
class _Block:
    """The surviving options of one layer under one (method, beta): the columns w of a block."""

    layer: int
    method: Method
    beta: int
    expert: np.ndarray  # (K,) the expert each option belongs to
    memory: np.ndarray  # (K,) memory index j
    replicas: np.ndarray  # (K,) replica count g, 1-based
    cost: np.ndarray  # (K,) $
    finish: np.ndarray  # (K,) s
    usd: float  # the layer's constant cost under this method (`layer_terms`)
    per_s: float  # the layer's cost per second of latency under this method


def _undominated(cost: np.ndarray, finish: np.ndarray) -> np.ndarray:
    """Mask of the options of one expert that no other option matches or beats everywhere.

    Among identical options the first survives, so every pruned option has a surviving one at
    least as good in cost and finish (the relation is a strict partial order).
    """
    as_good = (cost[None, :] <= cost[:, None]) & (
        finish[None, :] <= finish[:, None]
    )  # [a, b]: b is at least as good as a
    better = (cost[None, :] < cost[:, None]) | (finish[None, :] < finish[:, None])
    index = np.arange(cost.size)
    return ~(as_good & (better | (index[None, :] < index[:, None]))).any(axis=1)


def _block(
    inst: Instance, layer: int, method: Method, beta: int, *, timed: bool = True
) -> _Block | None:
    """Feasible, undominated options of every expert; None if some expert has no feasible one.

    Finish times are first raised to the block's floor: the latency the layer has whatever its
    experts choose, i.e. the slowest expert's fastest option. Below the floor a faster option
    buys nothing, so after raising, only the cheapest of those options survives dominance, and
    the max rows are unchanged for every choice (max_e max(f_e, floor) = max_e f_e when floor <=
    max_e f_e). On skewed counts most cold experts keep a single option. When latency neither
    meets an SLO nor costs money (`timed` False) only cost counts, and each expert keeps its
    cheapest option.
    """
    opts = expert_options(inst, layer, method, beta)
    if not opts.feasible.reshape(inst.experts, -1).any(axis=1).all():
        return None
    shape = opts.cost.shape
    finish = np.maximum(np.where(opts.feasible, opts.finish, np.inf), 0.0)
    finish = np.maximum(finish, finish.min(axis=(1, 2)).max())
    speed = finish if timed else np.zeros(shape)
    kept = []
    for e in range(inst.experts):
        ok = np.flatnonzero(opts.feasible[e].ravel())
        mask = _undominated(opts.cost[e].ravel()[ok], speed[e].ravel()[ok])
        kept.append(e * shape[1] * shape[2] + ok[mask])
    flat = np.concatenate(kept)
    expert, memory, replica = np.unravel_index(flat, shape)
    return _Block(
        layer,
        method,
        int(beta),
        expert,
        memory,
        replica + 1,
        opts.cost.ravel()[flat],
        finish.ravel()[flat],
        *layer_terms(inst, layer, method),
    )


def _covers(better: _Block, worse: _Block) -> bool:
    """Whether every option of `worse` has an option of `better` (same expert) at least as good.

    The layer's own terms must be no dearer either. Finish times are the floor-raised values,
    whose per-expert max is the block's true slowest finish.
    """
    if better.usd > worse.usd or better.per_s > worse.per_s:
        return False
    for e in np.unique(worse.expert):
        b, w = better.expert == e, worse.expert == e
        as_good = (better.cost[b][None, :] <= worse.cost[w][:, None]) & (
            better.finish[b][None, :] <= worse.finish[w][:, None]
        )
        if not as_good.any(axis=1).all():
            return False
    return True


def _undominated_blocks(blocks: list[_Block]) -> list[_Block]:
    """Drop a variant that another kept variant covers: choosing that one is never worse.

    Small betas pay T^dl per minibatch and lose to larger ones outright; identical variants
    (betas above every shard) collapse to one. Sequential removal is exact because covering is
    transitive: every dropped variant is covered by one that stays.
    """
    kept = list(blocks)
    for blk in blocks:
        if any(other is not blk and _covers(other, blk) for other in kept):
            kept.remove(blk)
    return kept


def _betas(inst: Instance, method: Method) -> tuple[int, ...]:
    return inst.betas if method is Method.PIPELINED else (1,)


@dataclass
class _Builder:
    """Accumulates columns and sparse rows, so that one model serves both backends."""

    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    binary: list[bool] = field(default_factory=list)
    entries: list[tuple[int, int, float]] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)

    def columns(
        self, n: int, *, binary: bool, cost: np.ndarray | None = None, lower: float = 0.0
    ) -> np.ndarray:
        """Add n columns (objective `cost`, zero by default); return their indices."""
        start = len(self.cost)
        self.cost += [0.0] * n if cost is None else cost.tolist()
        self.lower += [lower] * n
        self.binary += [binary] * n
        return np.arange(start, start + n)

    def row(self, cols: Iterable[int], vals: Iterable[float], lo: float, hi: float) -> None:
        row = len(self.row_lower)
        self.entries += [(row, int(c), float(v)) for c, v in zip(cols, vals, strict=True)]
        self.row_lower.append(lo)
        self.row_upper.append(hi)

    def per_expert(
        self,
        expert: np.ndarray,
        cols: np.ndarray,
        vals: np.ndarray,
        minus: int | None,
        lo: float,
        hi: float,
    ) -> None:
        """For each expert: lo <= sum of its vals * cols (- the `minus` column) <= hi."""
        for e in np.unique(expert):
            mine = expert == e
            extra = [] if minus is None else [minus]
            self.row([*cols[mine], *extra], [*vals[mine], *[-1.0] * len(extra)], lo, hi)

    def model(
        self, blocks: list[list[_Block]], w: list[list[np.ndarray]], z: list[list[int | None]]
    ) -> _Model:
        rows, cols, vals = zip(*self.entries, strict=True) if self.entries else ((), (), ())
        shape = (len(self.row_lower), len(self.cost))
        binary = np.array(self.binary, dtype=bool)
        return _Model(
            blocks=blocks,
            w=w,
            z=z,
            cost=np.array(self.cost),
            lower=np.array(self.lower),
            upper=np.where(binary, 1.0, np.inf),
            binary=binary,
            matrix=sparse.csr_matrix((vals, (rows, cols)), shape=shape),
            row_lower=np.array(self.row_lower),
            row_upper=np.array(self.row_upper),
        )


@dataclass(frozen=True, eq=False)
class _Model:
    """The assembled MILP and where each block's columns sit."""

    blocks: list[list[_Block]]  # per layer, its variants
    w: list[list[np.ndarray]]  # per layer and variant, the option columns
    z: list[list[int | None]]  # per layer and variant, its binary (None: the only variant)
    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    binary: np.ndarray
    matrix: sparse.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray

    def describe(self) -> str:
        return (
            f"{self.cost.size} columns ({int(self.binary.sum())} binary), "
            f"{self.row_lower.size} rows, {self.matrix.nnz} nonzeros"
        )


def _cheapest(blk: _Block) -> float:
    """Sum over experts of their cheapest option: a scale for the objective."""
    least = np.full(int(blk.expert.max()) + 1, np.inf)
    np.minimum.at(least, blk.expert, blk.cost)
    return float(least.sum())


def _build(
    inst: Instance, slo_s: float | None, allowed: Sequence[Sequence[Method]]
) -> _Model | None:
    """Assemble the MILP, or None when a layer has no variant where every expert fits."""
    blocks = []
    # Latency matters for the SLO and, under the full bill, for what it costs per second.
    timed = slo_s is not None or inst.objective == "full"
    for layer, methods in enumerate(allowed):
        found = [
            _block(inst, layer, m, beta, timed=timed) for m in methods for beta in _betas(inst, m)
        ]
        blocks.append(_undominated_blocks([blk for blk in found if blk is not None]))
        if not blocks[-1]:
            return None
    # Costs are ~1e-6..1e-2 $; dividing by a typical optimum keeps the solvers' absolute
    # tolerances (1e-6 and below) from swallowing the objective.
    scale = sum(min(_cheapest(blk) for blk in layer) for layer in blocks) or 1.0
    b = _Builder()
    w_cols, z_cols = [], []
    for layer in blocks:
        zs: list[int | None] = [None]
        if len(layer) > 1:
            fixed = np.array([blk.usd for blk in layer]) / scale
            zs = b.columns(len(layer), binary=True, cost=fixed).tolist()
            b.row(zs, [1.0] * len(zs), 1.0, 1.0)
        ws = []
        for blk, z in zip(layer, zs, strict=True):
            ws.append(b.columns(blk.cost.size, binary=True, cost=blk.cost / scale))
            ones = np.ones(blk.cost.size)
            rhs = 1.0 if z is None else 0.0
            b.per_expert(blk.expert, ws[-1], ones, z, rhs, rhs)
        w_cols.append(ws)
        z_cols.append(zs)
    if timed:
        _latency_rows(inst, b, blocks, w_cols, z_cols, scale, slo_s)
    return b.model(blocks, w_cols, z_cols)


def _max_rows(b: _Builder, blk: _Block, w: np.ndarray, values: np.ndarray, bound: int) -> None:
    """bound >= sum_k values[k] w[k] for each expert (experts that are always 0 need no row)."""
    positive = values > 0
    b.per_expert(blk.expert[positive], w[positive], values[positive], bound, -np.inf, 0.0)


def _level_rows(
    b: _Builder,
    blks: list[_Block],
    ws: list[np.ndarray],
    values: list[np.ndarray],
    bound: int,
    on: list[int],
    always: float,
) -> None:
    """Cuts through which the LP relaxation sees the max over experts, not each one's mean.

    With T_0 < T_1 < ... the distinct finish values of a layer's class and u_t >= 0
    continuous: u_t <= u_{t-1}; for every block, expert and level T_t of its own options,
    sum_{k: value_k >= T_t} w_k <= u_t; and bound >= T_0 * on + sum_t (T_t - T_{t-1}) u_t.
    With integral w every u_t up to the chosen slowest level is forced to 1, so the bound is
    that level exactly as the per-expert rows make it; fractionally, u_t >= max_e P_e(>= T_t)
    gives a far higher (still valid) bound than max_e E_e, which is what lets the solver
    close the gap at tight SLOs.
    """
    levels = np.unique(np.concatenate(values))
    if levels.size < 2:
        return  # one level: the per-expert rows already pin the bound
    u = b.columns(levels.size - 1, binary=False)  # u[t - 1] belongs to levels[t]
    for t in range(1, u.size):
        b.row([u[t], u[t - 1]], [1.0, -1.0], -np.inf, 0.0)
    for blk, w, value in zip(blks, ws, values, strict=True):
        for e in np.unique(blk.expert):
            mine = blk.expert == e
            own = np.unique(value[mine])
            for level in own[own > levels[0]]:
                tail = mine & (value >= level)
                t = int(np.searchsorted(levels, level))
                b.row([*w[tail], u[t - 1]], [*[1.0] * int(tail.sum()), -1.0], -np.inf, 0.0)
    steps = np.diff(levels)
    b.row([bound, *on, *u], [1.0, *[-levels[0]] * len(on), *(-steps)], levels[0] * always, np.inf)


def _latency_rows(
    inst: Instance,
    b: _Builder,
    blocks: list[list[_Block]],
    w_cols: list[list[np.ndarray]],
    z_cols: list[list[int | None]],
    scale: float,
    slo_s: float | None,
) -> None:
    """The max linearisation per layer, its cost per second, and the SLO row (12d).

    Variants of a layer that cost the same per second of latency share one column phi >= the
    chosen variant's slowest finish (phi of an unchosen group falls to 0); phi carries that cost
    in the objective, and the SLO row bounds the sum of every phi.
    """
    slo_cols: list[int] = []
    for blks, ws, zs in zip(blocks, w_cols, z_cols, strict=True):
        groups: dict[float, list[int]] = {}
        for i, blk in enumerate(blks):
            groups.setdefault(blk.per_s, []).append(i)
        for per_s, members in groups.items():
            on = [z for z in (zs[i] for i in members) if z is not None]  # the group is chosen
            always = 1.0 if zs[members[0]] is None else 0.0
            phi = int(b.columns(1, binary=False, cost=np.array([per_s / scale]))[0])
            group, gw = [blks[i] for i in members], [ws[i] for i in members]
            values = [blk.finish for blk in group]
            for blk, w, value in zip(group, gw, values, strict=True):
                _max_rows(b, blk, w, value, phi)
            _level_rows(b, group, gw, values, phi, on, always)
            slo_cols.append(phi)
    if slo_s is not None:
        b.row(slo_cols, [1.0] * len(slo_cols), -np.inf, slo_s - inst.fixed_s())


def _fastest_start(inst: Instance, model: _Model) -> np.ndarray:
    """A starting point (binaries only): in every layer the variant and options of least latency.

    Layers interact only through the SLO sum, so when any deployment meets the SLO this one
    does. Solvers given it never end a time
    limit empty-handed on a feasible instance and prune with its cost from the start.
    """
    x = np.zeros(model.cost.size)
    for blks, ws, zs in zip(model.blocks, model.w, model.z, strict=True):
        starts = []
        for blk, w in zip(blks, ws, strict=True):
            order = np.lexsort((blk.cost, blk.finish, blk.expert))
            first = order[np.r_[True, np.diff(blk.expert[order]) != 0]]  # one per expert
            latency = blk.finish[first].max()  # the layer's latency: its slowest expert
            starts.append((latency, w[first]))
        pick = min(range(len(starts)), key=lambda i: starts[i][0])
        x[starts[pick][1]] = 1.0
        if zs[pick] is not None:
            x[zs[pick]] = 1.0
    return x


def _choice(inst: Instance, model: _Model, x: np.ndarray) -> Choice:
    """Read the decision off the solution vector: the largest binary of each one-hot group."""
    method = np.zeros(inst.layers, dtype=int)
    beta = np.ones(inst.layers, dtype=int)
    memory = np.zeros((inst.layers, inst.experts), dtype=int)
    replicas = np.ones((inst.layers, inst.experts), dtype=int)
    for layer, (blks, ws, zs) in enumerate(zip(model.blocks, model.w, model.z, strict=True)):
        pick = 0 if zs[0] is None else int(np.argmax(x[zs]))
        blk, values = blks[pick], x[ws[pick]]
        method[layer], beta[layer] = int(blk.method), blk.beta
        for e in range(inst.experts):
            mine = np.flatnonzero(blk.expert == e)
            k = mine[np.argmax(values[mine])]
            memory[layer, e], replicas[layer, e] = blk.memory[k], blk.replicas[k]
    return Choice(method, beta, memory, replicas)


def _solve(
    inst: Instance,
    slo_s: float | None,
    allowed: Sequence[Sequence[Method]],
    solver: str,
    time_limit_s: float,
    backend: Backend,
) -> Solution | None:
    if backend not in ("auto", "highs", "gurobi"):
        raise UsageError(
            f"unknown MILP backend '{backend}'."
            + did_you_mean(backend, ("auto", "highs", "gurobi")),
            "use auto, highs or gurobi.",
        )
    start = time.perf_counter()
    model = _build(inst, slo_s, allowed)
    if model is None:
        return None
    result, used = run(model, _fastest_start(inst, model), backend, time_limit_s)
    if result.x is None:
        return None
    choice = _choice(inst, model, result.x)
    note = f"{used}; {model.describe()}"
    if not result.optimal:
        note += f"; time limit reached, gap {result.gap:.2g}"
    evaluation = evaluate(inst, choice, slo_s)
    return Solution(solver, choice, evaluation, time.perf_counter() - start, result.optimal, note)


def solve_milp(
    inst: Instance,
    method: Method,
    slo_s: float | None,
    *,
    time_limit_s: float = 60.0,
    backend: Backend = "auto",
) -> Solution | None:
    """The cheapest deployment in which every layer uses `method` (ODS's subproblem).

    Args:
        inst: The planning instance.
        method: The scatter-gather method of every layer; PIPELINED chooses beta per layer
            among `inst.betas`.
        slo_s: End-to-end latency limit in seconds, None for no limit.
        time_limit_s: Solver time limit in seconds. Defaults to 60.
        backend: "highs", "gurobi", or "auto" (the default): Gurobi when its licence accepts the
            model, otherwise HiGHS, with one warning per process when Gurobi refuses.

    Returns:
        The solution (solver "milp", the backend and model size in `note`; `optimal` is False
        when the time limit stopped the search), or None when no deployment meets the SLO.

    Raises:
        UsageError: the time limit passed before any deployment was found, or backend "gurobi"
            was asked for and Gurobi cannot solve the model.
    """
    allowed = [(Method(method),)] * inst.layers
    return _solve(inst, slo_s, allowed, "milp", time_limit_s, backend)


def solve_milp_mixed(
    inst: Instance,
    slo_s: float | None,
    *,
    allowed: Sequence[Iterable[Method]] | None = None,
    time_limit_s: float = 60.0,
    backend: Backend = "auto",
) -> Solution | None:
    """The cheapest deployment with a method chosen per layer: problem (12) itself.

    Args:
        allowed: Per layer, the methods it may use. Defaults to None: all three everywhere.
            A single method per layer gives the best options for a fixed method assignment.
        Others as in `solve_milp`.

    Returns:
        The solution (solver "milp-mixed"), or None when no deployment meets the SLO.
    """
    per_layer = [tuple(Method)] * inst.layers if allowed is None else [tuple(a) for a in allowed]
    if len(per_layer) != inst.layers or not all(per_layer):
        raise UsageError(
            f"allowed methods given for {len(per_layer)} layers, some possibly empty; "
            f"the instance has {inst.layers}.",
            "give a non-empty collection of methods for every layer.",
        )
    return _solve(inst, slo_s, per_layer, "milp-mixed", time_limit_s, backend)
