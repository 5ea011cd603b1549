"""A service's health check answers while a DiskANN graph is built in the same process.

diskannpy's build holds the GIL for its whole run, so built in the service's process it stopped
every other thread there, the gRPC server's included: a health check ran out of its deadline
(`streamrag status` said DOWN) until the build ended. The build runs in a child process
(retriever_svc/corpus/disk_build.py): here a real gRPC health service, in this process, answers
every check made while a real build runs, and the index built is searchable."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from retriever_svc.corpus.index import INDEX_PREFIX, BuildParams, build_disk_index, open_disk_searcher
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner
from tests.support.serving import LoopThread

VECTORS = 6000          # about 8 s of DiskANN build on one core here: many checks fall inside it
HEALTH_DEADLINE_S = 5.0  # generous: a starved server misses it by the length of the build


def test_health_answers_while_a_diskann_graph_is_built(tmp_path):
    host = LoopThread("health-during-build")
    runner = None
    try:
        async def start() -> int:
            nonlocal runner
            runner = ServiceRunner(ServiceConfig("anns", port=0, metrics_port=None), [], [])
            return await runner.start(handle_signals=False)

        port = host.run(start())
        vectors = np.random.default_rng(0).standard_normal((VECTORS, 384)).astype(np.float32)
        failure: list[BaseException] = []

        def build() -> None:
            try:
                build_disk_index(vectors, tmp_path, BuildParams(), threads=1)
            except BaseException as exc:   # reported by the test below
                failure.append(exc)

        builder = threading.Thread(target=build, name="diskann-build")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            serving = health_pb2.HealthCheckResponse.SERVING
            assert stub.Check(health_pb2.HealthCheckRequest(), timeout=30).status == serving
            builder.start()
            during = 0
            while builder.is_alive():
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_DEADLINE_S).status
                assert status == serving
                during += builder.is_alive()
                time.sleep(0.05)
            builder.join()
        assert not failure, failure
        assert during >= 3, f"only {during} checks fell inside the build"
        assert (tmp_path / f"{INDEX_PREFIX}_disk.index").exists()
        searcher = open_disk_searcher(tmp_path, beam_width=2, size=VECTORS)
        ids, _ = searcher.search(vectors[42], k_neighbors=1, complexity=64)
        assert int(ids[0]) == 42
    finally:
        if runner is not None:
            host.run(runner.stop(0))
        host.close()
