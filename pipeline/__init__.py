"""Scatter-gather transports (direct, S3, pipelined S3) and the local runtime on moto.

Empty until the serving-path issue.
"""
