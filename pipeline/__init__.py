"""Scatter-gather transports (direct, S3, pipelined S3), the S3 key scheme and the tensor codec.

The local runtime that executes the workflow against moto is not written yet.
"""
