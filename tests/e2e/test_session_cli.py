"""`streamrag session ...` against the whole stack: create a session, register a Flash Query,
feed it from the crawler as pages arrive, watch the Flash answer, ask, list, close; bad input
gets a clear message and a non-zero exit."""

from __future__ import annotations

import json

from streamrag.cli import main

INSTRUCTIONS = "You answer questions about Python using the documents below. Answer briefly."


def session(stack, capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["session", *argv, "--orchestrator", f"127.0.0.1:{stack.orchestrator_port}"])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_session_flow_from_the_command_line(stack, capsys):
    assert session(stack, capsys, "create", "--id", "docs", "--instructions", INSTRUCTIONS)[:2] == (0, "docs\n")
    code, out, _ = session(stack, capsys, "flash", "docs", "How do I close a file?", "--max-tokens", "4")
    assert code == 0 and "How do I close a file?" in out
    code, out, err = session(stack, capsys, "follow", "docs", "--retriever", "crawler", "--query",
                             "use the with statement to close a file", "--address",
                             stack.retriever_addresses["crawler"])
    assert code == 0 and "batch 1:" in err and "data version" in out
    version = int(out.split("data version ")[1].split(":")[0])
    assert version >= 1
    code, out, _ = session(stack, capsys, "watch", "docs", "--count", "1")
    assert code == 0 and "How do I close a file?" in out and "->" in out
    code, out, _ = session(stack, capsys, "ask", "docs", "What does the with statement do?", "--max-tokens", "6",
                           "--min-version", str(version), "--json")
    answer = json.loads(out)
    assert code == 0 and answer["data_version"] == version and answer["answer"]
    assert 0 < answer["shared_tokens"] <= answer["context_tokens"]
    code, out, _ = session(stack, capsys, "ask", "docs", "how do I close a FILE?")
    assert code == 0 and "a Flash answer" in out
    code, out, _ = session(stack, capsys, "list")
    assert code == 0 and out.startswith("docs ")
    code, out, _ = session(stack, capsys, "close", "docs")
    assert code == 0 and "closed docs" in out


def test_bad_input_gets_a_message_and_a_non_zero_exit(stack, capsys):
    code, _, err = session(stack, capsys, "ask", "no-such-session", "q?")
    assert code == 1 and "NOT_FOUND" in err and "no-such-session" in err
    session(stack, capsys, "create", "--id", "empty")
    code, _, err = session(stack, capsys, "ingest", "empty")
    assert code == 2 and "nothing to ingest" in err
    code, _, err = session(stack, capsys, "create", "--id", "empty")
    assert code == 1 and "ALREADY_EXISTS" in err
    code, _, err = session(stack, capsys, "follow", "empty", "--retriever", "anns", "--query", "x",
                           "--address", "127.0.0.1:1", "--timeout", "5")
    assert code == 1 and "UNAVAILABLE" in err
    session(stack, capsys, "close", "empty")
