"""Lambda handlers: head, layer (previous combine + non-MoE block + gate), expert, tail, cleanup.

Each module exposes `handler(event, context)`; configuration comes from `config.current()`,
weights from `weights` (downloaded once per warm container), transport from `pipeline`.
"""
