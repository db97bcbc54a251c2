"""Cold starts: what a new execution environment costs in time and money, in one place.

The traffic simulator, the traffic-aware planner and (later) the deployment read these rules;
the numbers (INIT limit, idle time, prices, measured import and load times) live in the
calibration file. Plain floats and numpy arrays only: no torch, boto3 or CDK here.

A function's INIT, when Lambda creates an execution environment for it (a cold start):

    INIT = image start                   (container image: lazily loaded, sourced lower bound)
         + interpreter start + import of the handler module        (measured, per role)
         + download of the manifest, config and the stage's weights (T^dl per object + bytes/B^s)
         + reading the weights and building the torch modules      (measured, fixed + per byte)

Rules (sources in `planner/data/calibration.json`):
- On demand, the INIT phase (image start, interpreter, imports: the weights load in the first
  call) is limited to `init_limit_s` (10 s); a longer INIT is abandoned and retried
  inside the first invocation, so the request waits the limit plus the whole INIT again, and
  both are billed. Provisioned environments initialise ahead of traffic, without that limit.
- Since 1 August 2025 the INIT phase is billed as duration for every configuration, at the
  function's GB-second rate.
- An environment serves one invocation at a time. An idle environment is reclaimed after
  `idle_s` (an assumption: AWS publishes no number); the next invocation that finds no idle
  environment starts a new one. Among idle environments the most recently used serves first
  (also an assumption, the one that keeps the fewest alive).
- Provisioned concurrency k keeps k environments initialised for the whole period and serves
  first; invocations beyond k run on demand. Its environments are billed all the time at the
  allocated rate, and their invocations at a lower duration rate.
- A function with reserved concurrency R runs at most R invocations at once (Lambda counts
  in-flight ones, provisioned included); more are throttled, and the state machine retries a
  throttled Task (`THROTTLE_RETRY`, the CDK app's retry policy) after 1, 2, 4, ... s with full
  jitter, which the simulator takes at its mean (half of each); still throttled after the last
  retry, the execution fails.
- A scheduled warmer pings a function every N minutes with k concurrent invocations that return
  at once: each ping is a billed request of `warm_start_s`, and keeps (or makes) k environments
  warm; a ping that finds none starts one and pays its INIT like any invocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ROLES", "THROTTLE_RETRY", "InitModel", "init_phase", "retry_waits", "stage_objects"]

ROLES = ("head", "layer", "expert", "tail", "driver")
# The state machine's retry of a throttled Lambda Task: IntervalSeconds (an integer in ASL),
# MaxAttempts, BackoffRate, with JitterStrategy FULL. cdk/_state_machine.py emits exactly this.
THROTTLE_RETRY: dict[str, float] = {"interval_s": 1, "max_attempts": 6, "backoff_rate": 2.0}


def retry_waits() -> tuple[float, ...]:
    """Mean seconds before each retry of a throttled invocation: full jitter draws uniformly
    below interval * backoff^k, so half of it on average."""
    r = THROTTLE_RETRY
    return tuple(
        r["interval_s"] * r["backoff_rate"] ** k / 2 for k in range(int(r["max_attempts"]))
    )


def stage_objects(role: str, hosted: int = 1) -> int:
    """Weight objects a function of `role` downloads besides the manifest and config: its stage
    file, one per hosted expert for a (packed) expert function, and for a driver every stage
    it builds, `hosted` counting them (`functions.weights`)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {ROLES}")
    return hosted if role in ("expert", "driver") else 1


@dataclass(frozen=True)
class InitModel:
    """The INIT seconds of a function from its role and weight bytes (see the module docstring).

    `config_objects` and `config_bytes` are what a head, gate or tail downloads before its stage
    (manifest.json and the config/ files); an expert downloads manifest.json alone,
    `manifest_bytes` (None: a reference that predates this, taken as the whole config).
    `load_fixed_s + load_s_per_byte * bytes` is reading the downloaded weights and building the
    modules, as measured on this machine. The fixed
    part is paid once per environment, not per stage file: it is the stage loader's own setup
    (`functions.weights.loader`, cached per process), which a packed function's second expert
    reuses.
    """

    image_start_s: float
    python_start_s: float
    import_s: Mapping[str, float]
    load_fixed_s: float
    load_s_per_byte: float
    config_objects: int
    config_bytes: int
    s3_delay_s: float
    s3_bandwidth_bytes_per_s: float
    limit_s: float
    manifest_bytes: int | None = None

    def phases(self, role: str, weight_bytes: float, hosted: int = 1) -> tuple[float, float]:
        """(INIT phase, first-call load) seconds of one new environment of a `role` function
        holding `weight_bytes` of weights.

        The handlers import at INIT and load their weights on their first call
        (`functions.weights`, cached per environment; a warmer's ping and a provisioned
        environment's INIT load them too, `functions.warm`). So only the first part is
        Lambda's INIT phase, under its limit; both are waited and billed.
        """
        objects, config_bytes = self.config_objects, self.config_bytes
        if role == "expert" and self.manifest_bytes is not None:
            objects, config_bytes = 1, self.manifest_bytes
        objects += stage_objects(role, hosted)
        download = (
            objects * self.s3_delay_s
            + (config_bytes + weight_bytes) / self.s3_bandwidth_bytes_per_s
        )
        load = self.load_fixed_s + self.load_s_per_byte * weight_bytes
        # A driver imports what a gate does (Hugging Face's stage classes, the transports); a
        # reference measured before drivers existed has no entry of its own for it.
        imported = self.import_s.get(role, self.import_s["layer"])
        return self.image_start_s + self.python_start_s + imported, download + load

    def seconds(self, role: str, weight_bytes: float, hosted: int = 1) -> float:
        """Seconds from a new environment's start to its first call's work (both phases)."""
        return sum(self.phases(role, weight_bytes, hosted))


def init_phase(init_s: float, limit_s: float) -> tuple[float, float]:
    """(seconds the invocation waits, seconds billed) for an on-demand INIT of `init_s`.

    Within the limit both are the INIT. Past it, Lambda abandons the INIT at the limit and runs
    it again inside the first invocation: the request waits, and the account pays, both.
    """
    if init_s <= limit_s:
        return init_s, init_s
    return limit_s + init_s, limit_s + init_s
