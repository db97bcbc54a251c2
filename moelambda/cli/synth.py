"""`moelambda synth`: the CloudFormation template of a plan's stack, checked by cfn-lint."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import ForceOpt, JsonOpt, app, check_out, err, stdout, user_errors

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


_FUNCTION = "AWS::Lambda::Function"
_NAME_BYTES = 64  # the longest name CloudFormation gives a function: what a reference may become
_ENVIRONMENT_BYTES = 4096  # Lambda's limit on a function's environment, keys and values


def _environment_bytes(variables: dict[str, Any]) -> int:
    """The most bytes an environment can take once deployed: each reference (a function's
    name, the bucket's) counted at the longest name it may resolve to."""

    def size(value: Any) -> int:
        if isinstance(value, str):
            return len(value)
        if isinstance(value, dict) and "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return sum(size(part) for part in parts) + len(separator) * max(len(parts) - 1, 0)
        return _NAME_BYTES

    return sum(len(key) + size(value) for key, value in variables.items())


def _template_facts(path: Path) -> dict[str, Any]:
    """A template's resources (by type), outputs, size and whether CloudFormation takes it."""
    template = json.loads(path.read_text())
    resources = Counter(r["Type"] for r in template.get("Resources", {}).values())
    environments = [
        _environment_bytes(r["Properties"].get("Environment", {}).get("Variables", {}))
        for r in template.get("Resources", {}).values()
        if r["Type"] == _FUNCTION
    ]
    facts = {
        "template": str(path),
        "resources": sum(resources.values()),
        "resource_types": dict(sorted(resources.items())),
        "outputs": len(template.get("Outputs", {})),
        "bytes": path.stat().st_size,
        "largest_environment_bytes": max(environments, default=0),
    }
    facts["within_limits"] = (
        facts["resources"] <= MAX_RESOURCES
        and facts["outputs"] <= MAX_OUTPUTS
        and facts["bytes"] <= MAX_TEMPLATE_BYTES
        and facts["largest_environment_bytes"] <= _ENVIRONMENT_BYTES
    )
    return facts


def _lint_all(paths: list[Path]) -> dict[str, Any]:
    """cfn-lint over the parent and nested templates: counts summed, errors by file."""
    verdicts = [(path, lint_template(path)) for path in paths]
    rules: Counter[str] = Counter()
    for _, verdict in verdicts:
        rules.update(verdict["rules"])
    return {
        "ok": all(v["ok"] for _, v in verdicts),
        **{k: sum(v[k] for _, v in verdicts) for k in ("errors", "warnings", "informational")},
        "rules": dict(sorted(rules.items())),
        "error_messages": [
            f"{path.name}: {message}" if len(paths) > 1 else message
            for path, v in verdicts
            for message in v["error_messages"]
        ],
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
        int | None,
        typer.Option(
            help="The account's Lambda concurrency quota: refuse a stack whose reserved "
            "concurrency would not leave Lambda's unreserved minimum of it. Default: the quota "
            "the plan was made under (`plan --concurrency-quota`), else 1000."
        ),
    ] = None,
    workflow: Annotated[
        str | None,
        typer.Option(
            help="Check that the plan's workflow type is this one (express or standard); the "
            "type is the plan's, since its bill was priced for it."
        ),
    ] = None,
    experts_per_stack: Annotated[
        int,
        typer.Option(
            help="With more expert functions than this, put them in nested stacks of whole "
            "layers, at most this many each (CloudFormation: 500 resources, 200 outputs, 1 MB "
            "per template)."
        ),
    ] = 64,
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
        document.check_concurrency_quota(concurrency_quota, synthesising=True)
    from cdk._functions import DEFAULT_BASE_IMAGE, FunctionOptions
    from cdk.app import build_app

    if force:
        _clear(out)
    options = FunctionOptions(
        reserve_concurrency=reserve_concurrency,
        expert_timeout_s=expert_timeout,
        tracing=tracing,
        base_image=base_image,
        experts_per_stack=experts_per_stack,
        concurrency_quota=concurrency_quota,
    )
    with err.status("synthesising the stack"):
        try:
            assembly = build_app(plan, out, stack_name=stack_name, options=options)
        except RuntimeError as error:
            shutil.rmtree(out, ignore_errors=True)  # nothing half-written
            if "TooManyResourcesInStack" not in str(error):
                raise
            widest = max(len(layer.experts) for layer in document.layers)
            raise UsageError(
                f"a template would hold more than CloudFormation's {MAX_RESOURCES} resources: "
                + str(error).split(": ", 1)[-1],
                f"nested stacks take whole layers, and a layer has {widest} expert functions "
                "(each with its own role): pack experts into functions (`moelambda plan --pack "
                "auto`), or pass a smaller --experts-per-stack.",
            ) from None
    stack = assembly.get_stack_by_name(stack_name)
    template_path = Path(stack.template_full_path)
    nested = sorted(template_path.parent.glob(f"{stack_name}*.nested.template.json"))
    templates = [_template_facts(path) for path in [template_path, *nested]]
    parent = templates[0]
    summary: dict[str, Any] = {
        "template": str(template_path),
        "assembly": str(out),
        "stack": stack_name,
        "workflow": document.workflow,
        "resources": parent["resources"],
        "resource_types": parent["resource_types"],
        "outputs": parent["outputs"],
        "functions": sum(t["resource_types"].get(_FUNCTION, 0) for t in templates),
        "template_bytes": parent["bytes"],
        "nested_stacks": len(nested),
        "templates": [{k: v for k, v in t.items() if k != "resource_types"} for t in templates],
        "largest_template_resources": max(t["resources"] for t in templates),
        "largest_environment_bytes": max(t["largest_environment_bytes"] for t in templates),
        "within_limits": all(t["within_limits"] for t in templates),
        "cdk_nag": {"pack": "AwsSolutions", "unacknowledged": 0},  # else build_app raised
        "base_image": {"reference": base_image or DEFAULT_BASE_IMAGE, "pinned": bool(base_image)},
        "cfn_lint": None,
    }
    if lint:
        with err.status("cfn-lint"):
            summary["cfn_lint"] = _lint_all([template_path, *nested])
    if as_json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    if summary["cfn_lint"] is not None and not summary["cfn_lint"]["ok"]:
        raise typer.Exit(1)


def _print_summary(summary: dict[str, Any]) -> None:
    console = stdout()
    nested = summary["nested_stacks"]
    title = f"Stack {summary['stack']}: {summary['resources']} resources"
    if nested:
        title += (
            f" and {nested} nested stacks of expert functions (largest template: "
            f"{summary['largest_template_resources']} resources)"
        )
    table = Table(title=title)
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
            f"{MAX_OUTPUTS} outputs or {MAX_TEMPLATE_BYTES:,} bytes in a template, or a "
            f"function's environment may exceed Lambda's {_ENVIRONMENT_BYTES:,} bytes (largest "
            f"{summary['largest_environment_bytes']:,}, names counted at {_NAME_BYTES}): it may "
            "not deploy. Pass a smaller --experts-per-stack, or pack experts (plan --pack)."
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
