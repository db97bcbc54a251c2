"""Run a GPU plan for real: one process per planned GPU rank on torch.distributed.

The plan's placement and all-to-all order are only predictions until tokens actually move. Here
every rank is a process (NCCL on CUDA, gloo on CPU: the same code, tensors on the rank's device).
The batch's windows are split over the ranks (data parallel: attention needs whole windows); each
rank runs the head, every layer's non-MoE block and router, and the tail on its own windows, and
loads, of the experts, only those the plan places on it. Per MoE layer the (token, expert)
assignments go to the ranks hosting their experts (a replicated expert's assignments split by the
plan's shares), through a dispatch all-to-all and back through a combine all-to-all.

Each layer's tokens move twice: along the PLANNED order (Aurora's contention-free rounds, or every
sender in destination rank order), as `dist.batch_isend_irecv` steps, and along the BASELINE
`dist.all_to_all_single`. Both must deliver bit-identical expert outputs, and the outputs of the
tail must match the monolithic model's forward on the same windows. The ranks' outputs and
timings come back to the parent as files in a temporary directory.

Timing: the all-to-all seconds are the data movement alone, each started after a barrier; the
per-(rank, expert) count all-gather that both paths need first (`all_to_all_single` must know
its output splits too) and the schedule's computation are in the layer's wall seconds, which
cover the planned path only (block, router, counts, dispatch, experts, combine, expert sum).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessContext, ProcessException

from gpu.plan import GpuLayerPlan, GpuPlan
from ground.errors import MoelambdaError, UsageError
from moe import ExpertStage, LayerOutput, LayerStage, MoEModel, StageLoader
from moe._stages import HeadStage, TailStage

__all__ = ["BACKENDS", "TOLERANCE", "WINDOW", "GpuRunError", "run_plan"]

WINDOW = 128  # tokens per window, as `moelambda profile` and `run-local` cut them
TOLERANCE = 1e-4  # max |distributed - monolithic| of a SUCCEEDED run
BACKENDS = ("gloo", "nccl")
_REFERENCE_BATCH = 16  # windows per monolithic forward call, which bounds the parent's memory
_PATHS = ("planned", "baseline")


class GpuRunError(MoelambdaError):
    """A distributed run that failed: a rank raised, timed out, or produced the wrong output."""


# --------------------------------------------------------------------------- the parent


def run_plan(
    plan: GpuPlan,
    *,
    tokens: int = 1024,
    seed: int = 0,
    backend: str | None = None,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Run `plan` on `plan.gpus` processes over `tokens` of the wiki corpus; check the output.

    Returns the status ("SUCCEEDED" when the tail's output is within `TOLERANCE` of the
    monolithic forward), the backend, GPUs, tokens, the max |diff|, the all-to-all seconds of
    both paths (dispatch + combine summed over layers, each the slowest rank's), the per-layer
    wall seconds of the planned path (slowest rank) and the error. A failure of any kind the user
    can act on (bad plan, rank exception, timeout) returns FAILED with its text; values not
    measured then are None (diff, a2a seconds) or empty (layer seconds).
    """
    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    result: dict[str, Any] = {
        "status": "FAILED",
        "backend": chosen,
        "gpus": plan.gpus,
        "tokens": 0,
        "max_abs_diff_vs_monolithic": None,
        "a2a_seconds": None,
        "layer_seconds": [],
        "error": None,
    }
    try:
        _check_backend(chosen, plan.gpus)
        _start_fork_server()
        model = _load_model(plan)
        ids = _windows(model, tokens, seed)
        result["tokens"] = int(ids.size)
        reference = _monolithic(model, ids)
        with tempfile.TemporaryDirectory(prefix="moelambda-gpu-run-") as tmp:
            root = Path(tmp)
            job = _Job(plan, _export_dir(plan, model, root), ids, chosen, root, timeout_s)
            _launch(_run_rank, job, plan.gpus, timeout_s)
            ranks = [torch.load(root / f"rank{r}.pt") for r in range(plan.gpus)]
    except MoelambdaError as err:
        result["error"] = str(err)
        return result
    output = torch.cat([r["output"] for r in ranks if r["output"] is not None])
    diff = float((output - reference).abs().max())
    a2a = torch.stack([r["a2a"] for r in ranks]).amax(dim=0)  # (layers, path, phase)
    result["max_abs_diff_vs_monolithic"] = diff
    result["a2a_seconds"] = {path: float(a2a[:, i].sum()) for i, path in enumerate(_PATHS)}
    result["layer_seconds"] = torch.stack([r["layer_s"] for r in ranks]).amax(dim=0).tolist()
    if diff <= TOLERANCE:
        result["status"] = "SUCCEEDED"
    else:
        result["error"] = f"max |diff| vs the monolithic model {diff:.3g} > {TOLERANCE:g}"
    return result


def _start_fork_server() -> None:
    """Start the process the ranks fork from, importing torch and the stages' code once.

    A spawned rank would import them itself: seconds per rank, 16 ranks on 2 cores. The server
    runs no torch op, so no thread pool or CUDA state is copied into a rank. Started here, it
    imports while this process loads the model.
    """
    mp.set_forkserver_preload([__name__, "transformers.modeling_utils"])
    forkserver.ensure_running()


def _check_backend(backend: str, gpus: int) -> None:
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend '{backend}'.", f"use one of {', '.join(BACKENDS)}.")
    if backend == "nccl" and not torch.cuda.is_available():
        raise UsageError("the nccl backend needs CUDA GPUs; none is visible.", "use gloo.")
    if backend == "nccl" and gpus > torch.cuda.device_count():
        raise UsageError(
            f"the plan has {gpus} GPU ranks and NCCL puts one per GPU; "
            f"{torch.cuda.device_count()} are visible.",
            "run on a machine with as many GPUs, or with the gloo backend.",
        )


def _load_model(plan: GpuPlan) -> MoEModel:
    """The plan's model, checked against the plan (layer count, experts, top-k)."""
    from moe import MoefyOptions, load_model

    ref = plan.model
    options = None if ref.moefy is None else MoefyOptions.from_description(ref.moefy)
    model = load_model(
        ref.name, experts=ref.experts, top_k=ref.top_k, seed=ref.moefy_seed, options=options
    )
    fix = "make the plan again with `moelambda gpu-plan` for this model."
    if (model.experts, model.top_k) != (ref.experts, ref.top_k):
        raise GpuRunError(
            f"the plan is for {ref.experts} experts top-{ref.top_k}; {model.name} has "
            f"{model.experts} experts top-{model.top_k}.",
            fix,
        )
    layers = [layer.layer for layer in plan.layers]
    if layers != list(range(model.num_layers)):
        raise GpuRunError(
            f"the plan places MoE layers {layers}; {model.name} has layers "
            f"0..{model.num_layers - 1}.",
            fix,
        )
    return model


def _windows(model: MoEModel, tokens: int, seed: int) -> np.ndarray:
    from moe import load_corpus, make_windows

    if tokens < 1:
        raise UsageError(f"tokens must be >= 1, not {tokens}.", "pass a positive token count.")
    return make_windows(
        load_corpus("wiki"), model.tokenizer, tokens=tokens, window=WINDOW, seed=seed
    )


def _monolithic(model: MoEModel, ids: np.ndarray) -> torch.Tensor:
    return torch.cat(
        [
            model.forward(torch.from_numpy(ids[start : start + _REFERENCE_BATCH]))
            for start in range(0, ids.shape[0], _REFERENCE_BATCH)
        ]
    )


def _export_dir(plan: GpuPlan, model: MoEModel, tmp: Path) -> Path:
    """The cached weight export of the model, or one written into `tmp` if there is none.

    `load_model` leaves no cache entry for a native MoE model, or when the disk refused it.
    """
    from moe import MoefyOptions, export_model
    from moe._cache import cached_export_dir

    ref = plan.model
    options = None if ref.moefy is None else MoefyOptions.from_description(ref.moefy)
    cached = cached_export_dir(
        ref.name, experts=ref.experts, top_k=ref.top_k, seed=ref.moefy_seed, options=options
    )
    if cached is not None:
        return cached
    export_model(model, tmp / "weights")
    return tmp / "weights"


@dataclass(frozen=True)
class _Job:
    """What every rank needs; pickled to each spawned process."""

    plan: GpuPlan
    export: Path
    ids: np.ndarray  # (windows, WINDOW) of the whole batch; each rank takes its own slice
    backend: str
    root: Path  # the run's temporary directory: rendezvous file and per-rank results
    timeout_s: float


def _launch(target: Callable[[int, _Job], None], job: _Job, ranks: int, timeout_s: float) -> None:
    """Run `target(rank, job)` in `ranks` processes; raise GpuRunError on any failure.

    The first rank to fail makes `join` terminate the others (they may be blocked in a
    collective); a run past `timeout_s` is killed. Either way no process outlives the call.
    """
    context = mp.start_processes(
        _rank_entry, args=(target, job), nprocs=ranks, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.2):
            if time.monotonic() > deadline:
                raise GpuRunError(
                    f"the run did not finish within {timeout_s:g} s.",
                    "raise the timeout, or run fewer tokens or GPUs.",
                )
    except ProcessException as err:
        raise GpuRunError(_rank_errors(job.root) or str(err), None) from err
    finally:
        _kill(context)


def _kill(context: ProcessContext) -> None:
    for process in context.processes:
        if process.is_alive():
            process.kill()
        process.join()


def _rank_errors(root: Path) -> str:
    """The errors the ranks wrote, first the first: a failed rank's peers fail after it."""
    errors = sorted(root.glob("rank*.error"), key=lambda path: path.stat().st_mtime_ns)
    return "\n".join(path.read_text() for path in errors)


def _rank_entry(rank: int, target: Callable[[int, _Job], None], job: _Job) -> None:
    """A rank's process: one CPU thread (up to 16 ranks share 2 cores), errors to a file."""
    torch.set_num_threads(1)
    try:
        target(rank, job)
    except BaseException as err:
        (job.root / f"rank{rank}.error").write_text(f"rank {rank}: {type(err).__name__}: {err}")
        raise


# --------------------------------------------------------------------------- one rank


@dataclass
class _RankModel:
    """The stages one rank loads: all non-MoE stages, and per layer only its own experts."""

    head: HeadStage
    layers: list[LayerStage]
    experts: list[dict[int, ExpertStage]]  # per layer, the experts this rank hosts
    tail: TailStage
    hidden_size: int
    top_k: int

    @classmethod
    def load(cls, root: Path, plan: GpuPlan, rank: int, device: torch.device) -> _RankModel:
        loader = StageLoader(root)
        head, tail = loader.head(), loader.tail()
        layers = [loader.layer(layer.layer) for layer in plan.layers]
        modules = [head.module, tail.combine, tail.tail]
        modules += [m for stage in layers for m in (stage.combine, stage.block, stage.router)]
        for module in modules:
            if module is not None:
                module.to(device)
        experts = [
            {
                h.expert: _expert_to(loader.expert(layer.layer, h.expert), device)
                for h in layer.placement[rank]
            }
            for layer in plan.layers
        ]
        m = loader.manifest
        return cls(head, layers, experts, tail, m.hidden_size, m.top_k)


def _expert_to(stage: ExpertStage, device: torch.device) -> ExpertStage:
    stage.w_in = stage.w_in.to(device)
    stage.w_out = stage.w_out.to(device)
    if stage.b_in is not None:
        stage.b_in = stage.b_in.to(device)
    return stage


def _device(rank: int, backend: str) -> torch.device:
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    """Wait for the device: NCCL work completes asynchronously to the host clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _barrier(device: torch.device) -> None:
    dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    _sync(device)


def _run_rank(rank: int, job: _Job) -> None:
    """Join the process group, run this rank's share of the windows, save its results."""
    plan = job.plan
    device = _device(rank, job.backend)
    dist.init_process_group(
        job.backend,
        init_method=f"file://{job.root / 'rendezvous'}",
        rank=rank,
        world_size=plan.gpus,
        timeout=timedelta(seconds=job.timeout_s),
    )
    with torch.inference_mode():
        model = _RankModel.load(job.export, plan, rank, device)
        ids = torch.from_numpy(np.array_split(job.ids, plan.gpus)[rank]).to(device)
        _warm_up(plan, rank, device)
        result = _forward(model, plan, rank, ids, device)
    torch.save(result, job.root / f"rank{rank}.pt")
    dist.destroy_process_group()


def _warm_up(plan: GpuPlan, rank: int, device: torch.device) -> None:
    """One row between every pair along every path, so no lazy connection setup is timed."""
    pairs = np.ones((plan.gpus, plan.gpus), dtype=np.int64)
    rows = torch.zeros(plan.gpus, 1, device=device)
    for order in sorted({layer.order for layer in plan.layers}):
        _a2a(rows, pairs, rank, _steps(pairs, order), device)
    _a2a(rows, pairs, rank, None, device)


def _forward(
    model: _RankModel, plan: GpuPlan, rank: int, ids: torch.Tensor, device: torch.device
) -> dict[str, Any]:
    """This rank's windows through every layer: the tail's output and the timings.

    Per layer the experts run twice, on the rows the planned path delivered and on those the
    baseline delivered; only the planned path is inside the layer's wall time.
    """
    if len(ids):
        residual = model.head.run(ids)
    else:  # fewer windows than ranks: this rank only hosts experts
        residual = torch.zeros(0, WINDOW, model.hidden_size, device=device)
    expert_sum = None
    a2a = torch.zeros(len(plan.layers), len(_PATHS), 2, dtype=torch.float64)
    layer_s = torch.zeros(len(plan.layers), dtype=torch.float64)
    for layer, (stage, layer_plan) in enumerate(zip(model.layers, plan.layers, strict=True)):
        _barrier(device)
        start = time.perf_counter()
        out = _layer_out(stage, residual, expert_sum, model.top_k)
        routed = _Routed.of(out, layer_plan, plan.gpus, plan.model.experts)
        planned = _expert_pass(out.ffn_in, routed, model.experts[layer], rank, device, True)
        expert_sum = torch.zeros_like(out.ffn_in).index_add_(
            0, routed.tokens, planned.back * routed.weights[:, None]
        )
        _sync(device)
        layer_s[layer] = time.perf_counter() - start
        baseline = _expert_pass(out.ffn_in, routed, model.experts[layer], rank, device, False)
        if not torch.equal(planned.back, baseline.back):
            raise GpuRunError(
                f"layer {layer_plan.layer}: the planned ({layer_plan.order}) and the baseline "
                "all-to-alls delivered different expert outputs."
            )
        a2a[layer] = torch.tensor([planned.seconds, baseline.seconds])
        residual = out.residual
    output = model.tail.run(residual, expert_sum).cpu() if len(ids) else None
    return {"output": output, "a2a": a2a, "layer_s": layer_s}


def _layer_out(
    stage: LayerStage, residual: torch.Tensor, expert_sum: torch.Tensor | None, top_k: int
) -> LayerOutput:
    """The layer's block and router; empty outputs on a rank without windows."""
    if len(residual):
        return stage.run(residual, expert_sum)
    rows = residual.reshape(0, residual.shape[-1])
    idx = torch.zeros(0, top_k, dtype=torch.long, device=rows.device)
    return LayerOutput(residual, rows, idx, rows.new_zeros(0, top_k), rows.new_zeros(0, top_k))


# --------------------------------------------------------------------------- routing


@dataclass(frozen=True)
class _Routed:
    """One layer's assignments of this rank, in the order the dispatch sends them.

    Rows go out grouped by destination rank, within it by expert, within that in token order.
    `counts` is every rank's (destination, expert) row counts, exchanged up front: a receiver
    reads from it how many rows each sender sends and which expert each row is for, so the
    data all-to-alls carry the hidden rows only.
    """

    tokens: torch.Tensor  # (A,) this rank's token of each row it sends
    weights: torch.Tensor  # (A,) the gate weight of that (token, expert)
    counts: torch.Tensor  # (n, n, E) rows sender i sends rank j for expert e
    pairs: np.ndarray  # (n, n) rows sender i sends rank j
    steps: list[list[_Transfer]]  # the planned dispatch
    back_steps: list[list[_Transfer]]  # the planned combine

    @classmethod
    def of(cls, out: LayerOutput, plan: GpuLayerPlan, ranks: int, experts: int) -> _Routed:
        """Route this rank's assignments and all-gather every rank's counts (a collective)."""
        flat = out.experts.reshape(-1)
        dest = _destinations(flat, _slots(plan, experts, flat.device), experts)
        key = dest * experts + flat
        order = torch.argsort(key, stable=True)
        mine = torch.bincount(key, minlength=ranks * experts).view(ranks, experts)
        gathered = [torch.empty_like(mine) for _ in range(ranks)]
        dist.all_gather(gathered, mine)
        counts = torch.stack(gathered).cpu()
        pairs = counts.sum(dim=2).numpy()
        return cls(
            tokens=order // out.experts.shape[1],
            weights=out.weights.reshape(-1)[order],
            counts=counts,
            pairs=pairs,
            steps=_steps(pairs, plan.order),
            back_steps=_steps(pairs.T, plan.order),
        )


@dataclass(frozen=True)
class _Slots:
    """A layer's placement as slots ordered by (expert, rank): who takes which part of an expert.

    `upto` is the expert's cumulative share up to and including the slot (exactly 1 for its last
    slot), so slot s takes the assignments from round(upto[s-1] * c) to round(upto[s] * c) of its
    expert's c assignments from one sender, in token order: every sender splits the same way.
    """

    expert: torch.Tensor  # (S,) long
    rank: torch.Tensor  # (S,) long
    upto: torch.Tensor  # (S,) float64


def _slots(plan: GpuLayerPlan, experts: int, device: torch.device) -> _Slots:
    expert, rank, upto = [], [], []
    for e, hosts in enumerate(plan.hosts(experts)):
        shares = np.cumsum([share for _, share in hosts])
        shares[-1] = 1.0  # the shares add up to 1 within the plan's tolerance
        expert += [e] * len(hosts)
        rank += [r for r, _ in hosts]
        upto += shares.tolist()
    return _Slots(
        torch.tensor(expert, device=device),
        torch.tensor(rank, device=device),
        torch.tensor(upto, dtype=torch.float64, device=device),
    )


def _destinations(flat_experts: torch.Tensor, slots: _Slots, experts: int) -> torch.Tensor:
    """The rank each assignment goes to: its expert's host, replicas split by their shares.

    Sorting by expert gives each assignment a position; each slot ends at its expert's start plus
    its rounded cumulative share of the expert's count, and those ends ascend over the slots, so
    one searchsorted finds every assignment's slot.
    """
    by_expert = torch.argsort(flat_experts, stable=True)
    count = torch.bincount(flat_experts, minlength=experts)
    start = torch.cumsum(count, 0) - count
    ends = start[slots.expert] + torch.round(slots.upto * count[slots.expert]).long()
    position = torch.arange(len(flat_experts), device=flat_experts.device)
    dest = torch.empty_like(flat_experts)
    dest[by_expert] = slots.rank[torch.searchsorted(ends, position, right=True)]
    return dest


# --------------------------------------------------------------------------- moving tokens


class _Transfer(NamedTuple):
    """Rows lo:hi of the chunk sender `src` has for rank `dst`."""

    src: int
    dst: int
    lo: int
    hi: int


def _steps(pairs: np.ndarray, order: str) -> list[list[_Transfer]]:
    """The planned exchange of the (n, n) row counts: steps, each one `batch_isend_irecv`.

    Every rank computes the same steps from the same counts, so each knows what to send and to
    receive in each step. A sender's rows for itself never cross the network and are in no step.
    """
    return _aurora_steps(pairs) if order == "aurora" else _rank_order_steps(pairs)


def _rank_order_steps(pairs: np.ndarray) -> list[list[_Transfer]]:
    """Destination rank order: in step d every sender sends its whole chunk to rank d.

    This is the order as a synchronous program: all senders hit the same receiver at once (the
    incast Aurora's rounds avoid). It cannot deadlock: each step's sends and receives are posted
    together in one batch, and every rank runs the steps in the same sequence.
    """
    n = len(pairs)
    return [
        [
            _Transfer(src, dst, 0, int(pairs[src, dst]))
            for src in range(n)
            if src != dst and pairs[src, dst]
        ]
        for dst in range(n)
    ]


def _aurora_steps(pairs: np.ndarray) -> list[list[_Transfer]]:
    """Aurora's contention-free rounds (each a permutation): one step per round.

    A round may carry part of a pair's rows; the real-valued amounts are cut into whole rows by
    rounding each pair's running total, so the pieces add up to the pair's count exactly.
    """
    from gpu.aurora.a2a import schedule

    n = len(pairs)
    remote = pairs.astype(float)
    np.fill_diagonal(remote, 0.0)
    sent = np.zeros((n, n))
    steps = []
    for rnd in schedule(remote, bandwidth=np.ones(n), token_bytes=1.0).rounds:
        step = []
        for src, (dst, amount) in enumerate(
            zip(rnd.dest.tolist(), rnd.tokens.tolist(), strict=True)
        ):
            if dst < 0 or dst == src or amount <= 0:
                continue
            lo = round(sent[src, dst])
            sent[src, dst] += amount
            hi = min(round(sent[src, dst]), int(pairs[src, dst]))
            if hi > lo:
                step.append(_Transfer(src, dst, lo, hi))
        steps.append(step)
    short = np.argwhere(np.rint(sent) != remote)
    if len(short):
        src, dst = short[0]
        raise GpuRunError(
            f"the Aurora schedule moves {sent[src, dst]:g} of the {remote[src, dst]:g} rows "
            f"rank {src} sends rank {dst}."
        )
    return steps


@dataclass(frozen=True)
class _Pass:
    """The experts' outputs back at the sender, aligned with its sent rows, and the seconds."""

    back: torch.Tensor
    seconds: tuple[float, float]  # dispatch, combine


def _expert_pass(
    x: torch.Tensor,
    routed: _Routed,
    hosted: dict[int, ExpertStage],
    rank: int,
    device: torch.device,
    planned: bool,
) -> _Pass:
    """Dispatch the rows, run this rank's experts on what arrived, send the outputs back."""
    pairs = routed.pairs
    sent = x.index_select(0, routed.tokens)
    arrived, dispatch_s = _a2a(sent, pairs, rank, routed.steps if planned else None, device)
    expert_of_row = torch.repeat_interleave(
        torch.arange(routed.counts.shape[2]).repeat(len(pairs)),
        routed.counts[:, rank, :].reshape(-1),
    ).to(device)
    outputs = _run_experts(arrived, expert_of_row, hosted, rank, routed.counts.shape[2])
    back, combine_s = _a2a(outputs, pairs.T, rank, routed.back_steps if planned else None, device)
    return _Pass(back, (dispatch_s, combine_s))


def _run_experts(
    rows: torch.Tensor,
    expert_of_row: torch.Tensor,
    hosted: dict[int, ExpertStage],
    rank: int,
    experts: int,
) -> torch.Tensor:
    """Each hosted expert on all the rows it received, from every sender at once."""
    order = torch.argsort(expert_of_row, stable=True)
    sizes = torch.bincount(expert_of_row, minlength=experts).tolist()
    out = torch.empty_like(rows)
    for expert, positions in enumerate(order.split(sizes)):
        if not len(positions):
            continue
        if expert not in hosted:
            raise GpuRunError(
                f"rank {rank} received rows for expert {expert}, which it does not host."
            )
        out[positions] = hosted[expert].run(rows.index_select(0, positions))
    return out


def _a2a(
    send: torch.Tensor,
    pairs: np.ndarray,
    rank: int,
    steps: list[list[_Transfer]] | None,
    device: torch.device,
) -> tuple[torch.Tensor, float]:
    """One all-to-all of rows; the rows received and this rank's seconds from a barrier.

    `send` holds pairs[rank, j] rows for rank j, in rank order; the rows received come grouped
    by sender the same way. `steps` None is the baseline `all_to_all_single`, otherwise the
    planned steps. Only the data moves in the timed span: the counts were exchanged before.
    """
    send_sizes, recv_sizes = pairs[rank].tolist(), pairs[:, rank].tolist()
    recv = send.new_empty(sum(recv_sizes), send.shape[1])
    _barrier(device)
    start = time.perf_counter()
    if steps is None:
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes)
    else:
        _p2p(send, recv, pairs, rank, steps)
    _sync(device)
    return recv, time.perf_counter() - start


def _p2p(
    send: torch.Tensor,
    recv: torch.Tensor,
    pairs: np.ndarray,
    rank: int,
    steps: list[list[_Transfer]],
) -> None:
    """The planned steps, one `batch_isend_irecv` each, after copying the rows kept locally."""
    send_at = np.concatenate([[0], np.cumsum(pairs[rank])]).tolist()
    recv_at = np.concatenate([[0], np.cumsum(pairs[:, rank])]).tolist()
    mine = int(pairs[rank, rank])
    recv[recv_at[rank] : recv_at[rank] + mine] = send[send_at[rank] : send_at[rank] + mine]
    for step in steps:
        ops = [
            dist.P2POp(dist.isend, send[send_at[t.dst] + t.lo : send_at[t.dst] + t.hi], t.dst)
            for t in step
            if t.src == rank
        ] + [
            dist.P2POp(dist.irecv, recv[recv_at[t.src] + t.lo : recv_at[t.src] + t.hi], t.src)
            for t in step
            if t.dst == rank
        ]
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
