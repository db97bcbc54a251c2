"""Measure the caller's share of a synchronous Lambda Invoke on this machine: boto3 building,
signing and sending one Invoke over a kept-alive connection and parsing the response, the median
of N calls (the lower bound the calibration file's `invoke_round_trip_s` cites).

The Lambda front end and the callee are replaced by a local HTTP server that answers at once,
so the rest of a real round trip (routing to a warm environment, the callee's start, the network
within a Region) is not in the figure. The event carries one row of Mixtral's hidden state
(4,096 float32, base64), the size of a decode step's row.

    python scripts/invoke-client.py [N]
"""

from __future__ import annotations

import base64
import json
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3

ROW = base64.b64encode(bytes(4096 * 4)).decode()
RESPONSE = json.dumps({"payload": ROW}).encode()


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Without it, Nagle's algorithm and delayed ACKs add 40 ms to every localhost reply.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(RESPONSE)))
        self.end_headers()
        self.wfile.write(RESPONSE)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = boto3.client(
        "lambda",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{server.server_port}",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    event = json.dumps({"request_id": "r", "layer": 0, "expert": 0, "payload": ROW})

    def invoke() -> float:
        started = time.perf_counter()
        client.invoke(FunctionName="expert", Payload=event)["Payload"].read()
        return time.perf_counter() - started

    for _ in range(20):  # warm the connection pool and botocore's caches
        invoke()
    times = sorted(invoke() for _ in range(calls))
    print(
        f"median {statistics.median(times) * 1e3:.2f} ms, "
        f"p90 {times[int(0.9 * len(times))] * 1e3:.2f} ms over {calls} calls "
        f"(boto3 {boto3.__version__})"
    )
    server.shutdown()


if __name__ == "__main__":
    main()
