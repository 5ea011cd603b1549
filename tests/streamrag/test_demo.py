"""`streamrag demo` is fair: both runs replay one recorded retrieval, each on a cold prefix
cache (or, with --keep-cache, the table says the baseline is warm); `ask` lists each page once.

The end-to-end test runs the demo against a real local stack on the tiny corpus (free ports,
temporary run directory).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from protos import common_pb2
from retriever_svc.replay.trace import read_trace
from streamrag.ask import source_line, unique_sources
from streamrag.stack import state
from tests.support.stack import streamrag


def test_each_page_is_listed_once_with_how_many_of_its_passages_were_used():
    docs = [common_pb2.Document(id="a#1", title="Files", url="http://x/files.html"),
            common_pb2.Document(id="b", title="Lists", url="http://x/lists.html"),
            common_pb2.Document(id="a#2", title="Files", url="http://x/files.html"),
            common_pb2.Document(id="a#3", title="Files", url="http://x/files.html"),
            common_pb2.Document(id="n1", title="No URL"), common_pb2.Document(id="n2", title="No URL")]
    pages = unique_sources(docs)
    assert [(d.url, n) for d, n in pages] == [("http://x/files.html", 3), ("http://x/lists.html", 1), ("", 1), ("", 1)]
    assert source_line(*pages[0]).endswith("http://x/files.html (3 passages)")
    assert "passages" not in source_line(*pages[1])


def table_row(output: str, name: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith(name))
    return line[len(name):].split()


def replayed_chunks(output: str) -> list[int]:
    """How many replayed chunks each run printed (streaming first)."""
    runs = re.split(r"^--- (?:streaming|non-streaming \(baseline\)) ---$", output, flags=re.M)[1:]
    return [run.count("(replayed;") for run in runs]


@pytest.fixture
def tiny_stack(tiny_index: Path, run_dir: Path):
    up = streamrag("up", "--run-dir", str(run_dir), "--free-ports", "--corpus-root", str(tiny_index.parent / "site"),
                   "--index", str(tiny_index), "--timeout", "240")
    assert up.returncode == 0, up.stdout + up.stderr
    yield run_dir
    streamrag("down", "--run-dir", str(run_dir))


def test_the_demo_replays_one_retrieval_twice_each_on_a_cold_cache(tiny_stack: Path):
    run_dir = tiny_stack
    before = {s.name: s.pid for s in state.read_state(run_dir).services}
    demo = streamrag("demo", "--run-dir", str(run_dir), "--question", "How do I read a file?", "--max-tokens", "8")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    trace = read_trace(run_dir / "demo" / "retrieval.jsonl")
    assert len(trace.queries) == 1 and trace.queries[0].workload == "anns+crawler"
    chunks = len(trace.queries[0].chunks)
    assert f"recorded {chunks} chunks" in out and replayed_chunks(out) == [chunks, chunks]
    assert table_row(out, "prefix-cache hit tokens") == ["0", "0"], out
    streamed_tokens, baseline_tokens = table_row(out, "prompt tokens")
    assert streamed_tokens == baseline_tokens, "both runs must put the same prompt in front of the model"
    assert "each on a freshly restarted replica" in out
    after = state.read_state(run_dir)
    replica = next(s for s in after.services if s.name == "inference-0")
    assert replica.pid != before["inference-0"] and replica.restarts == 0, "a deliberate restart is not a crash"
    assert {s.name: s.pid for s in after.services if s.name != "inference-0"} == \
        {name: pid for name, pid in before.items() if name != "inference-0"}
    assert not listening(int(replay_port(after))), "the demo's replay retriever must be stopped"

    warm = streamrag("demo", "--run-dir", str(run_dir), "--question", "How do I read a file?", "--max-tokens", "8",
                     "--keep-cache")
    assert warm.returncode == 0, warm.stdout + warm.stderr
    _, baseline_hits = table_row(warm.stdout, "prefix-cache hit tokens")
    assert int(baseline_hits) > 0 and "is WARM" in warm.stdout, warm.stdout


def listening(port: int) -> bool:
    """Something accepts connections on `port` (a bind test would also fail on the TIME_WAIT
    sockets a stopped server leaves behind)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def replay_port(recorded: state.StackState) -> str:
    from streamrag.stack.plan import replay_target

    return replay_target(recorded.services).rsplit(":", 1)[1]
