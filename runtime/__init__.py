"""The local runtime: what runs a plan on this machine, below the command line.

The moto run of a plan's workflow with the real handlers (`runtime.local`), local generation
(`runtime.generate`), the front door on moto (`runtime.front_door`), the replay of a request
stream through real processes (`runtime.traffic_replay`, its environments in
`runtime.environments`) and the cold-start probe (`runtime.coldstart`). It puts cdk/,
functions/, pipeline/ and planner/ together; the CLI (`moelambda`) calls it and renders, and
nothing below imports it.
"""
