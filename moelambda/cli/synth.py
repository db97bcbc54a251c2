"""`moelambda synth`: the CloudFormation template of a plan's stack, checked by cfn-lint."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import ForceOpt, JsonOpt, app, check_out, err, user_errors

# CloudFormation's quotas per template (https://docs.aws.amazon.com/AWSCloudFormation/latest/
# UserGuide/cloudformation-limits.html): a plan with many experts can exceed them.
MAX_RESOURCES = 500
MAX_OUTPUTS = 200
MAX_TEMPLATE_BYTES = 1_000_000  # uploaded through S3, as `cdk deploy` does


def lint_template(path: Path, region: str = "us-east-1") -> dict[str, Any]:
    """cfn-lint's verdict on a template: counts by severity and by rule, and the errors."""
    from cfnlint.api import ManualArgs, lint_file

    matches = lint_file(path, config=ManualArgs(regions=[region]))
    severity = Counter(m.rule.severity for m in matches)
    errors = [
        f"{m.rule.id} {m.message} ({'/'.join(str(p) for p in m.path)})"
        for m in matches
        if m.rule.severity == "error"
    ]
    return {
        "ok": not errors,
        "errors": severity["error"],
        "warnings": severity["warning"],
        "informational": severity["informational"],
        "rules": dict(sorted(Counter(m.rule.id for m in matches).items())),
        "error_messages": errors,
    }


def _clear(out: Path) -> None:
    """--force replaces only a cloud assembly CDK wrote (manifest.json), never other data."""
    if out.is_dir() and any(out.iterdir()):
        if not (out / "manifest.json").is_file():
            raise UsageError(
                f"'{out}' is not a CDK cloud assembly; --force only replaces one.",
                "pick a new or empty --out.",
            )
        shutil.rmtree(out)


@app.command()
@user_errors
def synth(
    plan: Annotated[Path, typer.Option(help="Plan JSON from `moelambda plan`.")] = Path(
        "out/plan.json"
    ),
    out: Annotated[Path, typer.Option(help="Cloud assembly directory to write.")] = Path(
        "cdk.out"
    ),
    reserve_concurrency: Annotated[
        bool,
        typer.Option(
            help="Reserve each expert function's replica count of concurrency (needs quota)."
        ),
    ] = True,
    expert_timeout: Annotated[int, typer.Option(help="Expert function timeout, seconds.")] = 300,
    stack_name: Annotated[str, typer.Option(help="CloudFormation stack name.")] = "MoeLambda",
    lint: Annotated[bool, typer.Option(help="Run cfn-lint on the template.")] = True,
    tracing: Annotated[
        bool, typer.Option(help="X-Ray active tracing on every function and the workflow.")
    ] = False,
    base_image: Annotated[
        str | None,
        typer.Option(
            help="Build the image on this base pinned by digest "
            "(public.ecr.aws/lambda/python:3.12@sha256:...); default: the Dockerfile's tag."
        ),
    ] = None,
    concurrency_quota: Annotated[
        int,
        typer.Option(
            help="The account's Lambda concurrency quota: refuse a stack whose reserved "
            "concurrency would not leave Lambda's unreserved minimum of it."
        ),
    ] = 1000,
    workflow: Annotated[
        str | None,
        typer.Option(
            help="Check that the plan's workflow type is this one (express or standard); the "
            "type is the plan's, since its bill was priced for it."
        ),
    ] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Synthesise the serving stack of a plan (bucket, functions, state machine) with the CDK.

    Writes a cloud assembly that `cdk deploy --app DIR` deploys; needs no Docker (the image is
    only staged), no AWS account and no CDK CLI. cdk-nag's AwsSolutions rules run on the stack:
    an unacknowledged finding exits 2 naming it (acknowledgements, each with its reason, are in
    cdk/nag.py). Exits 1 when cfn-lint reports errors.
    """
    from ground.plan import Plan

    check_out(out, force)
    if not 1 <= expert_timeout <= 900:
        raise UsageError(f"--expert-timeout {expert_timeout} s is not 1-900 s.", "pick 1-900.")
    document = Plan.load(plan)  # a bad plan fails here with its PlanError, before the CDK starts
    if workflow not in (None, "express", "standard"):
        raise UsageError(f"unknown --workflow '{workflow}'.", "use express or standard.")
    if workflow is not None and workflow != document.workflow:
        raise UsageError(
            f"the plan was priced for a {document.workflow} workflow, not {workflow}.",
            f"re-plan with `moelambda plan --workflow {workflow}`, then synthesise that plan.",
        )
    if reserve_concurrency:
        document.check_concurrency_quota(concurrency_quota)
    from cdk._functions import DEFAULT_BASE_IMAGE, FunctionOptions
    from cdk.app import build_app

    if force:
        _clear(out)
    options = FunctionOptions(
        reserve_concurrency=reserve_concurrency,
        expert_timeout_s=expert_timeout,
        tracing=tracing,
        base_image=base_image,
    )
    with err.status("synthesising the stack"):
        try:
            assembly = build_app(plan, out, stack_name=stack_name, options=options)
        except RuntimeError as error:
            shutil.rmtree(out, ignore_errors=True)  # nothing half-written
            if "TooManyResourcesInStack" not in str(error):
                raise
            functions = sum(len(layer.experts) + 1 for layer in document.layers) + 3
            raise UsageError(
                f"the stack would hold more than CloudFormation's {MAX_RESOURCES} resources per "
                f"template ({functions:,} functions, each with its own role): "
                + str(error).split(": ", 1)[-1],
                "splitting a plan into nested stacks is not implemented yet; plan a model with "
                "fewer experts per stack (the plan's layers x experts functions).",
            ) from None
    stack = assembly.get_stack_by_name(stack_name)
    template_path = Path(stack.template_full_path)
    template = json.loads(template_path.read_text())
    resources = Counter(r["Type"] for r in template.get("Resources", {}).values())
    summary: dict[str, Any] = {
        "template": str(template_path),
        "assembly": str(out),
        "stack": stack_name,
        "workflow": document.workflow,
        "resources": sum(resources.values()),
        "resource_types": dict(sorted(resources.items())),
        "outputs": len(template.get("Outputs", {})),
        "functions": resources["AWS::Lambda::Function"],
        "template_bytes": template_path.stat().st_size,
        "within_limits": sum(resources.values()) <= MAX_RESOURCES
        and len(template.get("Outputs", {})) <= MAX_OUTPUTS
        and template_path.stat().st_size <= MAX_TEMPLATE_BYTES,
        "cdk_nag": {"pack": "AwsSolutions", "unacknowledged": 0},  # else build_app raised
        "base_image": {"reference": base_image or DEFAULT_BASE_IMAGE, "pinned": bool(base_image)},
        "cfn_lint": None,
    }
    if lint:
        with err.status("cfn-lint"):
            summary["cfn_lint"] = lint_template(template_path)
    if as_json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    if summary["cfn_lint"] is not None and not summary["cfn_lint"]["ok"]:
        raise typer.Exit(1)


def _print_summary(summary: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"Stack {summary['stack']}: {summary['resources']} resources")
    table.add_column("resource type")
    table.add_column("count", justify="right")
    for kind, count in summary["resource_types"].items():
        table.add_row(kind, str(count))
    console.print(table)
    base = summary["base_image"]
    if not base["pinned"]:
        console.print(
            f"Image base {base['reference']} is a tag, which AWS re-points as it patches: pin "
            "it with --base-image REPOSITORY@sha256:<digest> for a reproducible image."
        )
    if not summary["within_limits"]:
        console.print(
            f"[yellow]warning:[/] over CloudFormation's {MAX_RESOURCES} resources, "
            f"{MAX_OUTPUTS} outputs or {MAX_TEMPLATE_BYTES:,} bytes per template; this stack "
            "will not deploy as one template."
        )
    lint = summary["cfn_lint"]
    if lint is None:
        verdict = "cfn-lint skipped"
    elif lint["ok"]:
        rules = ", ".join(f"{k} x{v}" for k, v in lint["rules"].items()) or "none"
        verdict = f"cfn-lint: no errors ({lint['warnings']} warnings: {rules})"
    else:
        verdict = f"cfn-lint: {lint['errors']} errors:\n  " + "\n  ".join(lint["error_messages"])
    console.print(
        f"cdk-nag AwsSolutions: no unacknowledged findings (acknowledged ones: cdk/nag.py)\n"
        f"{verdict}\nWrote {summary['template']}",
        highlight=False,
    )
