"""Lambda handlers (head, layer = non-MoE block + gate, expert, tail).

Empty until the serving-path issue: the stages they will run already exist in `moe`
(`StageLoader`, `run_staged`).
"""
