"""How a plan's request runs, by its deployment: the one place a deployment's traits are spelled.

A plan's `deployment` names one `Topology` here. The CDK app, the handlers, the re-scorer and the
traffic model ask the plan's topology what it does (is a driver function running the request?
may it have expert functions? does it generate?) instead of comparing the name, so that a new
deployment is one registry line with its traits, and `tests/test_layering.py` holds that no
module outside this one and the planner's shape registry (`planner.batch_shapes.SHAPES`)
branches on a deployment's name.

    workflow    the fan-out Step Functions workflow: a head function, a gate per layer
                reaching its experts' functions by the layer's method, a tail
    driver      a driver function runs the non-MoE stack and its local experts in process and
                Invokes every other expert's function itself (`ground.driver`)
    monolithic  the driver with every expert local: one function, no expert function
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["TOPOLOGIES", "Topology", "topology"]


@dataclass(frozen=True)
class Topology:
    """What a deployment runs.

    `driven`: one driver function serves the request (the state machine is one Task), rather
    than the state machine fanning out over head, gates, experts and tail. `expert_functions`:
    how many experts have their own function: "none" (every expert runs in the driver), "some"
    (at least one; the driver runs the others), "all" (the fan-out workflow). A deployment
    generates exactly when it is driven: a decode step of the fan-out workflow would pay a
    transition and S3 round trips per layer and per token.
    """

    name: str
    driven: bool
    expert_functions: Literal["none", "some", "all"]
    what: str

    @property
    def generates(self) -> bool:
        """Whether a plan of this deployment may generate (`Plan.generation`)."""
        return self.driven

    def function_names(self, layers: list[Any]) -> list[str]:
        """The deployment's functions in order, as reports and capacity policies name them;
        `layers` are the plan's `LayerPlan`s."""
        experts = [
            [f"layer{layer.layer:02d}/expert{e.expert:02d}" for e in layer.experts]
            for layer in layers
        ]
        if self.driven:
            return ["driver", *(name for names in experts for name in names)]
        gated = (
            [f"layer{layer.layer:02d}", *names]
            for layer, names in zip(layers, experts, strict=True)
        )
        return ["head", *(name for group in gated for name in group), "tail"]

    def check_expert_functions(self, functions: int) -> None:
        """Raise ValueError where a plan of this deployment has `functions` expert functions
        it may not have."""
        if self.expert_functions == "none" and functions:
            raise ValueError(f"a {self.name} plan has no expert function, this one {functions}")
        if self.expert_functions == "some" and not functions:
            raise ValueError(f"a {self.name} plan invokes at least one expert function")


TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology("workflow", False, "all", "the fan-out Step Functions workflow"),
        Topology("driver", True, "some", "a driver invoking its remote experts"),
        Topology("monolithic", True, "none", "one function holding every expert"),
    )
}


def topology(deployment: str) -> Topology:
    """The topology named `deployment`.

    Raises:
        KeyError: No such deployment (the plan schema refuses one before this is asked).
    """
    return TOPOLOGIES[deployment]
