"""`moelambda generate`: a decoder plan's deployment generating text on moto, real handlers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from ground.errors import UsageError
from moelambda.cli._app import JsonOpt, app, err, load_with_status, stdout, user_errors


@app.command("generate")
@user_errors
def generate(
    plan: Annotated[
        Path, typer.Option(help="A driver or monolithic plan of a decoder (`moelambda plan`).")
    ] = Path("out/plan.json"),
    prompt: Annotated[
        list[str] | None, typer.Option(help="A prompt; repeat for several, decoded together.")
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help='A file of prompts: JSONL ({"prompt": ...} or strings) or one per line.'
        ),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt at most.")] = 64,
    temperature: Annotated[
        float, typer.Option(help="0 decodes greedily; above 0 samples at this temperature.")
    ] = 0.0,
    top_p: Annotated[
        float, typer.Option(help="With --temperature: sample from the smallest set of this mass.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seeds the sampling.")] = 0,
    stop: Annotated[
        list[str] | None, typer.Option(help="Stop a sequence at this text (repeatable).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Generate text through the plan's deployment (prefill, then decode steps with the KV cache
    in the driver), streaming it as it comes, and meter its requests against the plan's."""
    from ground.plan import Plan
    from moe import GenerationConfig

    texts = _prompts(prompt, prompts)
    try:
        settings = GenerationConfig(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=tuple(stop or ()),
        )
    except ValidationError as error:
        first = error.errors()[0]
        name = "--" + str(first["loc"][0]).replace("_", "-")
        raise UsageError(f"{name}: {first['msg']}.", f"pass a valid {name}.") from None
    document = Plan.load(plan)
    ref = document.model
    if ref.model_type.startswith("shape:"):
        raise UsageError(
            f"'{plan}' plans the model shape {ref.model}, which has no weights to run.",
            "plan a model you have (--traces or --counts) to generate with it.",
        )
    from runtime.generate import check_generation, check_request, generate_locally

    check_request(document, texts, settings)  # before the model loads
    model = load_with_status(
        ref.model, ref.experts, ref.top_k, ref.seed, True, ref.moefy, ref.weights
    )
    check_generation(document, model, texts, settings)  # before moto, the CDK and Node start
    console = stdout()
    streamed = not as_json and len(texts) == 1

    def show(_: int, text: str) -> None:
        console.print(text, end="", highlight=False, soft_wrap=True, markup=False)

    with err.status("generating on moto") as status:
        summary = generate_locally(
            plan,
            model,
            texts,
            settings,
            on_text=show if streamed else None,
            progress=status.update,
        )
    if summary["status"] != "SUCCEEDED":
        err.print(f"[bold red]failed:[/] {summary.get('error')}: {summary.get('cause')}")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(summary))
        return
    if streamed:
        console.print()
    _render(console, summary, texts, streamed)


def _prompts(given: list[str] | None, path: Path | None) -> list[str]:
    """The prompts of --prompt or --prompts (not both)."""
    if given and path is not None:
        raise UsageError("--prompt and --prompts both give prompts.", "pass one of them.")
    if path is None:
        if not given:
            raise UsageError("no prompt was given.", "pass --prompt TEXT or --prompts FILE.")
        return list(given)
    try:
        lines = [
            (number, line)
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if line.strip()
        ]
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read --prompts {path}: {error}.", "pass a text file.") from None
    if not lines:
        raise UsageError(f"--prompts {path} has no prompt.", "put one prompt per line.")
    return [_prompt_of(line, f"{path}:{number}") for number, line in lines]


def _prompt_of(line: str, where: str) -> str:
    """A JSONL line ({"prompt": ...} or a JSON string), else the line itself (plain text, a
    number included); a JSON object or array without a prompt string is refused."""
    try:
        value: Any = json.loads(line)
    except json.JSONDecodeError:
        return line
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("prompt"), str):
        return value["prompt"]
    if isinstance(value, dict | list):
        if isinstance(value, list):
            found = "a JSON array"
        elif "prompt" in value:
            found = f'an object whose "prompt" is {_json_kind(value["prompt"])}, not text'
        else:
            keys = ", ".join(json.dumps(k) for k in value) or "none"
            found = f'an object without "prompt" (its keys: {keys})'
        raise UsageError(
            f"--prompts {where} is {found}.",
            'write each line as {"prompt": "TEXT"}, a JSON string ("TEXT"), or plain text.',
        )
    return line


def _json_kind(value: Any) -> str:
    """A JSON value's kind, as a message names it."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return f"the number {json.dumps(value)}"
    return "an object" if isinstance(value, dict) else "an array"


def _render(console: Any, summary: dict[str, Any], texts: list[str], streamed: bool) -> None:
    if not streamed:
        for i, (text, out) in enumerate(zip(texts, summary["outputs"], strict=True)):
            console.print(f"[bold]prompt {i + 1}:[/] {text}", highlight=False)
            console.print(out["text"], highlight=False, markup=False)
            console.print()
    for i, out in enumerate(summary["outputs"]):
        tpot = "-" if out["tpot_s"] is None else f"{out['tpot_s'] * 1000:.1f} ms"
        console.print(
            f"prompt {i + 1}: {len(out['token_ids'])} tokens ({out['finish_reason']}), "
            f"TTFT {out['ttft_s']:.3f} s, TPOT {tpot}",
            highlight=False,
        )
    metered, planned = summary["requests"]["metered"], summary["requests"]["planned"]
    same = "as planned" if metered == planned else f"planned {planned}"
    console.print(
        f"{summary['deployment']}: {metered['lambda_requests']} Lambda request(s) over "
        f"{summary['decode_steps']} decode steps ({same}); bill ${summary['bill_usd']:.6f} "
        "(the metered usage at the plan's prices, with this machine's seconds)",
        highlight=False,
    )
