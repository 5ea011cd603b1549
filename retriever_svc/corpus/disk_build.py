"""DiskANN's graph build, run in a child process.

`diskannpy.build_disk_index` holds the GIL for its whole run (measured here: 8,000 vectors,
10.5 s of build, and another thread of the same process did not run once in those 10.5 s). In
the retriever service that thread is the gRPC server's: while the default index or a
collection's next generation was built, no search and no health check was answered (`streamrag
status` said DOWN, Deadline Exceeded; a liveness probe would restart the pod mid-build). So the
build runs in a child (`python -m retriever_svc.corpus.disk_build`), which gets the vectors
through a `.npy` file in the index directory, and the service's threads keep running. The child
dies with its parent (Linux's parent-death signal): a retriever killed mid-build leaves no build
behind to write into the directory its restart builds in again.

    build_disk_index_in_child(vectors, directory, complexity=128, graph_degree=64, alpha=1.2,
                              pq_chunks=96, threads=0, index_prefix="ann")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

VECTORS_FILE = ".build-vectors.npy"


def build_disk_index_in_child(vectors, directory: Path, *, index_prefix: str, **params: float | int) -> None:
    """Build DiskANN's disk index of `vectors` into `directory` in a child process; RuntimeError with
    the child's last words when it fails. `params`: complexity, graph_degree, alpha, pq_chunks, threads."""
    import numpy as np

    path = Path(directory) / VECTORS_FILE
    np.save(path, np.ascontiguousarray(vectors, dtype=np.float32))
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(directory), index_prefix, json.dumps(params),
                               str(os.getpid())],
                              capture_output=True, text=True, env={"RUST_LOG": "warn", **os.environ})
    finally:
        path.unlink(missing_ok=True)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(f"the DiskANN build failed (exit {done.returncode}): " + " | ".join(last))


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (PR_SET_PDEATHSIG); exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)        # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit("the process that asked for this build is gone")


def _build(directory: Path, index_prefix: str, params: dict) -> None:
    import diskannpy
    import numpy as np

    vectors = np.load(directory / VECTORS_FILE)
    diskannpy.build_disk_index(
        vectors, "l2", str(directory), complexity=params["complexity"], graph_degree=params["graph_degree"],
        build_memory_maximum=max(0.25, vectors.nbytes * 4 / 2**30), num_threads=params["threads"],
        alpha=params["alpha"], num_of_pq_chunks=min(params["pq_chunks"], vectors.shape[1]), index_prefix=index_prefix)


if __name__ == "__main__":
    _die_with(int(sys.argv[4]))
    _build(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
