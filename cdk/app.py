"""The CDK app: one `MoeServingStack` from a plan file.

`build_app(plan_path, outdir)` synthesises without the CDK CLI. With the CLI, `cdk.json` runs
`python -m cdk.app`, which reads the plan path from the context (`cdk synth -c plan=plan.json`,
default out/plan.json) and other settings from the context too:
`-c reserve_concurrency=false`, `-c expert_timeout_s=300`, `-c stack_name=MoeLambda`,
`-c weights_prefix=weights/`, `-c tracing=true` (X-Ray on functions and workflow),
`-c base_image=public.ecr.aws/lambda/python:3.12@sha256:...` (the image's base by digest),
`-c concurrency_quota=N` (what a stream plan's worker reservation is checked against). Warm
functions cache their weights by key and never look again: deploy a new export under a new
prefix (`-c weights_prefix=weights-v2/`), not over the old one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aws_cdk as cdk
    from aws_cdk import cx_api

    from cdk._functions import FunctionOptions

__all__ = ["DEFAULT_PLAN", "DEFAULT_STACK", "add_stack", "build_app"]

DEFAULT_PLAN = "out/plan.json"
DEFAULT_STACK = "MoeLambda"


def add_stack(
    app: cdk.App,
    plan_path: str | Path,
    *,
    stack_name: str = DEFAULT_STACK,
    options: FunctionOptions | None = None,
) -> Any:
    """Load and validate the plan (PlanError if unusable) and add its stack to `app`."""
    from cdk.stack import MoeServingStack
    from ground.plan import Plan

    plan = Plan.load(plan_path)
    return MoeServingStack(app, stack_name, plan=plan, options=options)


def build_app(
    plan_path: str | Path,
    outdir: str | Path,
    *,
    stack_name: str = DEFAULT_STACK,
    options: FunctionOptions | None = None,
) -> cx_api.CloudAssembly:
    """Synthesise the plan's stack into the cloud assembly directory `outdir`.

    Raises:
        NagError: cdk-nag's AwsSolutions rules found an unacknowledged finding.
    """
    import aws_cdk as cdk

    from cdk.nag import REPORT, add_checks, nag_error

    app = cdk.App(outdir=str(outdir))
    add_stack(app, plan_path, stack_name=stack_name, options=options)
    add_checks(app)
    try:
        return app.synth()
    except RuntimeError:
        if (Path(outdir) / REPORT).exists():  # cdk-nag failed the stack: say what it found
            raise nag_error(Path(outdir)) from None
        raise


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")


def main() -> None:
    """Entry point of `cdk.json`'s app command."""
    import aws_cdk as cdk

    from cdk._functions import FunctionOptions
    from cdk.nag import add_checks
    from ground.errors import MoelambdaError

    app = cdk.App()
    add_checks(app)
    ctx = app.node.try_get_context
    defaults = FunctionOptions()
    try:
        options = FunctionOptions(
            reserve_concurrency=_flag(ctx("reserve_concurrency"), True),
            expert_timeout_s=int(ctx("expert_timeout_s") or defaults.expert_timeout_s),
            stage_timeout_s=int(ctx("stage_timeout_s") or defaults.stage_timeout_s),
            weights_prefix=str(ctx("weights_prefix") or defaults.weights_prefix),
            tracing=_flag(ctx("tracing"), False),
            base_image=ctx("base_image") or None,
            concurrency_quota=int(ctx("concurrency_quota") or 0) or None,
        )
        add_stack(
            app,
            ctx("plan") or DEFAULT_PLAN,
            stack_name=ctx("stack_name") or DEFAULT_STACK,
            options=options,
        )
    except MoelambdaError as error:  # a bad plan or option: the message, not a traceback
        print(
            f"error: {error.problem}\nTo fix: {error.fix} (cdk synth -c plan=FILE)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    app.synth()


if __name__ == "__main__":
    main()
