"""Driver function: one request's whole model in one process, with its remote experts invoked.

The driver (`ground.driver`) runs the non-MoE stack of every layer (head, attention blocks,
norms, gates, combines, tail) and its local experts in process, through the one layer loop
(`moe.run_stages`); each layer's other experts it invokes, all at once, while its local experts
compute (the layer lasts the longer of the two, `ground.driver.layer_seconds`), carrying their
rows inline or, past the Invoke payload limit, through S3 (`pipeline.transports.call_remote`). A
monolithic function is the driver with every expert local. A warm driver keeps every stage it
built (`functions.weights`).

A GPU-backed driver (its placement, `ground.placement`, set by the CDK app from the plan) builds
its stages and local experts on its device at bfloat16 and runs the layer loop there; what
crosses its boundary (the rows its remote experts get and return, its output) is float32 on
the host, as for any function (`moe.on_host`).

Its local experts come from its environment (MOELAMBDA_DRIVER_LOCAL, which a provisioned
environment's INIT and a warmer's ping need); the remote ones, whose function names could pass
Lambda's 4 KB of environment, from the event the one-state workflow gives it (`remote`, set by
the state machine's definition, not by the caller).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

# Building the stages needs Hugging Face's model classes: their import belongs to INIT.
import transformers.modeling_utils  # noqa: F401

from functions import config, metrics, warm, weights
from functions.common import (
    CapacityError,
    request_ids,
    s3_client,
    use_lambda_threads,
    write_results,
)
from ground import layout
from ground.errors import UsageError
from ground.semantics import runtime_replicas
from moe import (
    LayerOutput,
    Step,
    eos_ids,
    gather_shards,
    generate_tokens,
    generation_request,
    on_host,
    place,
    routing_shards,
    run_stages,
)
from pipeline import transports

__all__ = ["DriverStages", "RemoteExperts", "handler"]


class DriverStages:
    """The driver's stages, from the warm cache (`moe.Stages`)."""

    def __init__(self, s3: Any, bucket: str, prefix: str) -> None:
        self._where = (s3, bucket, prefix)

    def head(self) -> Any:
        return weights.head(*self._where)

    def layer(self, layer: int) -> Any:
        return weights.layer(*self._where, layer)

    def tail(self) -> Any:
        return weights.tail(*self._where)

    def expert(self, layer: int, expert: int) -> Any:
        return weights.expert(*self._where, layer, expert)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "execution", "input", "remote"} -> {"request_id", "output_key"}.

    A forward request's output is the tail's (embeddings or logits). A generation request
    (`input["generate"]`: `prompts`, token id lists, and the `moe.GenerationConfig` fields)
    runs a prefill and its decode steps here, with every sequence's KV cache in this process
    (`moe.generate_tokens`); its output is the new token ids (-1 past a sequence's end) and the
    seconds since the start at which each arrived, and it writes each step's tokens where the
    routing metrics go (stdout on Lambda), so a client can stream them. Each layer that calls
    remote experts writes there too its local experts' seconds, its remote calls' and its own
    (`driver_layer`): run-local sets them against `ground.driver.layer_seconds`.

    Intermediates exist only for shards that went through S3; they are deleted before the
    driver returns, whether it succeeds or fails (the workflow's cleanup is the fallback for
    a driver that dies). A second delivery computes the same output again.
    """
    if warm.is_ping(event):
        return warm.answer("driver")
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    manifest = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest
    local = cfg.driver_local
    remote = config.remote_plan(event.get("remote"), manifest.num_layers, local, manifest.experts)
    stages = DriverStages(s3, cfg.bucket, cfg.weights_prefix)
    call = RemoteExperts(s3, cfg, request_id, manifest, local, remote, stages)
    request = (event.get("input") or {}).get("generate")
    key = layout.output_key(request_id)
    try:
        if request is not None:
            if cfg.placement.device != "cpu":
                raise UsageError(
                    "this driver runs on a GPU, which serves forward requests only: generation "
                    "on GPU-backed Lambda is not built yet.",
                    "plan the decoder's generation with --hardware cpu.",
                )
            arrays = _generate(request, s3, cfg, request_id, manifest, stages, call)
        else:
            ids = place(cfg.placement, torch.from_numpy(request_ids(s3, cfg.bucket, event)))
            output = run_stages(stages, manifest.num_layers, ids, call)
            result = on_host(output).numpy()
            write_results(s3, cfg.bucket, result, (event.get("input") or {}).get("requests"))
            arrays = (result,)
        transports.write_tensors(s3, cfg.bucket, key, *arrays)
    finally:
        call.close()
        if call.overflowed:
            transports.delete_request(s3, cfg.bucket, request_id)
    return {"request_id": request_id, "output_key": key}


class RemoteExperts:
    """The driver's `moe.ExpertCall`: local experts in process, the others invoked.

    A forward pass (and a generation's prefill) splits an expert's rows over the replicas the
    plan gave it; a decode step's few rows go to one replica per expert, more only where one
    cannot hold them (`decoding`): one Invoke per remote expert hit, as `ground.generation`
    counts them.
    """

    def __init__(
        self,
        s3: Any,
        cfg: config.Config,
        request_id: str,
        manifest: Any,
        local: list[list[int]],
        remote: list[list[config.RemoteFunction]],
        stages: DriverStages,
        counts: np.ndarray | None = None,
    ) -> None:
        self.s3, self.cfg, self.request_id = s3, cfg, request_id
        # Where a caller that decodes many steps sums each layer's routing (a worker: one EMF
        # record per layer per invocation, not per step); None: one record per call.
        self.counts = counts
        self.manifest, self.local, self.remote, self.stages = manifest, local, remote, stages
        self.overflowed = 0
        self.decoding = False
        # One thread that carries a layer's remote calls while this one runs the local experts.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="remote-experts")

    def close(self) -> None:
        """Ends the remote calls' thread (every call has joined it by then)."""
        self._pool.shutdown(wait=True)

    def __call__(self, layer: int, out: LayerOutput) -> torch.Tensor:
        m, cfg = self.manifest, self.cfg
        routed = out.experts.reshape(-1).cpu().numpy()
        counts = np.bincount(routed[routed < m.experts], minlength=m.experts)
        if self.counts is None:
            record = metrics.expert_counts_record(layer, counts, self.request_id)
            metrics.emit(record, cfg.metrics_file)
        else:
            self.counts[layer] += counts
        shards_of = routing_shards(out.experts, out.weights, m.experts)
        functions = self.remote[layer]
        shards = _shards(layer, functions, shards_of, decoding=self.decoding)
        # The remote experts' Invokes start first and wait on the network while the local
        # experts compute: a layer takes max(local, slowest remote), as every model prices it
        # (`ground.driver.layer_seconds`).
        started = time.perf_counter()
        calling = any(s.tokens.size for s in shards)  # a decode step often hits none
        remote = (
            None
            if not calling
            else self._pool.submit(
                _timed,
                transports.call_remote,
                self.s3,
                cfg.bucket,
                self.request_id,
                layer,
                on_host(out.ffn_in).numpy(),
                shards,
                [f.function for f in functions],
                cfg.invoke,
                cfg.payload_limit,
            )
        )
        try:
            parts = {
                e: (shards_of[e][0], shards_of[e][1], self.stages.expert(layer, e).run(x))
                for e in self.local[layer]
                if (x := out.ffn_in[shards_of[e][0]]).numel()
            }
        except BaseException:
            if remote is not None and remote.exception() is None:  # joined: its S3 shards
                self.overflowed += remote.result()[0][1]  # are cleaned up
            raise
        local_s = time.perf_counter() - started
        (got, over), remote_s = ({}, 0), 0.0
        if remote is not None:
            (got, over), remote_s = remote.result()
        self.overflowed += over
        if calling:
            timing = {
                "kind": "driver_layer",
                "request_id": self.request_id,
                "layer": layer,
                "local_s": round(local_s, 6),
                "remote_s": round(remote_s, 6),
                "layer_s": round(time.perf_counter() - started, 6),
            }
            metrics.emit(timing, cfg.metrics_file)
        for slot, f in enumerate(functions):
            tokens, w = shards_of[f.expert]
            pieces = [got[key] for key in sorted(got) if key[0] == slot]
            if pieces:
                rows = torch.from_numpy(np.concatenate(pieces))
                parts[f.expert] = (tokens, w, rows.to(out.ffn_in.device, out.ffn_in.dtype))
        # expert by expert, as the monolithic forward adds them
        ordered = [parts[e] for e in sorted(parts)]
        return gather_shards(out.ffn_in.shape[0], m.hidden_size, ordered)


def _timed(call: Any, *args: Any) -> tuple[Any, float]:
    """`call(*args)` and the seconds it took."""
    started = time.perf_counter()
    return call(*args), time.perf_counter() - started


def _generate(
    request: Any,
    s3: Any,
    cfg: config.Config,
    request_id: str,
    manifest: Any,
    stages: DriverStages,
    call: RemoteExperts,
) -> tuple[np.ndarray, np.ndarray]:
    """Prefill and decode the request's prompts; (new ids, arrival seconds), (B, steps) each."""
    loader = weights.loader(s3, cfg.bucket, cfg.weights_prefix)
    family = loader.family
    prompts, settings = generation_request(request, int(family.config.vocab_size))

    def on_step(step: Step) -> None:
        call.decoding = True  # every call after the prefill's is a decode step's
        record = {
            "kind": "generated_tokens",
            "request_id": request_id,
            "step": step.index,
            "tokens": [int(t) if a else -1 for t, a in zip(step.tokens, step.active, strict=True)],
            "seconds": round(step.seconds, 6),
        }
        metrics.emit(record, cfg.metrics_file)

    done = generate_tokens(
        stages,
        manifest.num_layers,
        prompts,
        call,
        settings,
        pad_id=0,
        eos_ids=eos_ids(family.config),
        sliding_window=getattr(family.config, "sliding_window", None),
        tokenizer=loader.tokenizer if settings.stop else None,
        on_step=on_step,
    )
    width = max(len(g.token_ids) for g in done)
    ids = np.full((len(done), width), -1, dtype=np.int64)
    times = np.full((len(done), width), np.nan, dtype=np.float32)
    for b, g in enumerate(done):
        ids[b, : len(g.token_ids)] = g.token_ids
        times[b, : len(g.step_times)] = g.step_times
    return ids, times


def _shards(
    layer: int,
    functions: list[config.RemoteFunction],
    shards_of: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    decoding: bool = False,
) -> list[transports.ShardRows]:
    """Each remote expert's rows split over the replicas its real tokens need (the plan's,
    more where one replica's memory cannot hold its share, up to its cap), as a direct gate
    splits them (`ground.semantics.runtime_replicas`); a decode step's over one replica, more
    only where one cannot hold them.

    Raises:
        CapacityError: An expert's tokens do not fit even its cap of replicas.
    """
    tokens = np.array([shards_of[f.expert][0].numel() for f in functions], dtype=int)
    planned = np.array([1 if decoding else f.replicas for f in functions], dtype=int)
    cap = np.array([f.max_replicas for f in functions], dtype=int)
    fits = np.array([f.max_tokens for f in functions], dtype=int)
    replicas = runtime_replicas(tokens, planned, cap, fits) if functions else planned
    over = np.flatnonzero(replicas > cap)
    if over.size:
        which = "; ".join(
            f"expert {functions[i].expert}: {tokens[i]:,} tokens, at most {fits[i]:,} per "
            f"replica on {cap[i]} replicas"
            for i in over
        )
        raise CapacityError(
            f"layer {layer} cannot take this batch: {which}",
            "make the plan again with more memory for these experts, or send smaller batches.",
        )
    shards = []
    for slot, (f, count) in enumerate(zip(functions, replicas, strict=True)):
        rows = shards_of[f.expert][0].cpu().numpy().astype(np.int64)
        for r, chunk in enumerate(np.array_split(rows, int(count))):
            shards.append(
                transports.ShardRows(slot, r, chunk, np.array([chunk.size], dtype=np.int64))
            )
    return shards


warm.preload_if_provisioned("driver")
