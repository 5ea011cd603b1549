"""A process that serves only the shared plumbing, for the SIGTERM test.

Prints `PORT <grpc> <metrics>` once serving; exits 0 after a graceful stop.
"""

from __future__ import annotations

import asyncio
import sys

from protos import inference_pb2, inference_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner


async def main() -> None:
    runner = ServiceRunner(
        ServiceConfig(service="inference", port=0, metrics_port=0, grace_s=1.0),
        [(inference_pb2_grpc.add_InferenceServicer_to_server, inference_pb2_grpc.InferenceServicer())],
        [inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name],
    )
    await runner.start()
    print(f"PORT {runner.port} {runner.metrics_port}", flush=True)
    await runner.wait()
    print("STOPPED", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
