"""Your own documents end to end, as a user does it: `streamrag collection create`, `index add` of
a folder of mixed files, `ask --collection` (the answering file is among the sources), `index
remove` (it is gone), and the statuses of a bad or unknown collection, all through the CLI
against the whole stack (real retriever, orchestrator, model and Redis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrag.cli import main

QUESTION = "How often does the zorblax kiwi plant need watering?"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def documents(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    (folder / "garden").mkdir(parents=True)
    (folder / "garden" / "kiwi.md").write_text(
        "# Kiwi care\n\n## Watering\n\nThe zorblax kiwi plant needs watering every three days with rainwater.\n")
    (folder / "backups.txt").write_text("Backups\n\nThe nightly database backup runs at 02:00 on vault7.\n")
    (folder / "deploy.rst").write_text("Deploying\n=========\n\nShip a release with ``make ship``.\n")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    return folder


def test_ask_a_collection_of_your_own_files(stack, capsys, documents):
    anns = ["--anns", stack.retriever_addresses["anns"]]
    orchestrator = ["--orchestrator", f"127.0.0.1:{stack.orchestrator_port}"]
    assert cli(capsys, "collection", "create", "mine", *anns)[0] == 0

    code, out, err = cli(capsys, "index", "add", str(documents), "--collection", "mine", "--quiet", *anns)
    assert code == 0, err
    assert "3 added" in out and "1 not indexed" in out
    assert "broken.pdf" in err                                  # one clear line for the unreadable file

    kiwi = str(documents / "garden" / "kiwi.md")
    code, out, err = cli(capsys, "ask", QUESTION, "--collection", "mine", "--max-tokens", "8", "--json",
                         *orchestrator)
    assert code == 0, err
    sources = [source["url"] for source in json.loads(out)["sources"]]
    assert any(url.startswith(kiwi) for url in sources), sources

    code, out, err = cli(capsys, "index", "remove", str(documents / "garden"), "--collection", "mine", *anns)
    assert code == 0 and "removed 1 files" in out, (out, err)
    code, out, err = cli(capsys, "ask", QUESTION, "--collection", "mine", "--max-tokens", "8", "--json",
                         *orchestrator)
    assert code == 0, err
    assert not any(source["url"].startswith(kiwi) for source in json.loads(out)["sources"])

    assert cli(capsys, "collection", "drop", "mine", *anns)[0] == 0


@pytest.mark.parametrize(("collection", "status"), [("nope", "NOT_FOUND"), ("bad/name", "INVALID_ARGUMENT")])
def test_ask_a_collection_that_cannot_be_searched_fails_clearly(stack, capsys, collection, status):
    code, _, err = cli(capsys, "ask", QUESTION, "--collection", collection, "--max-tokens", "4",
                       "--orchestrator", f"127.0.0.1:{stack.orchestrator_port}")
    assert code == 1
    assert f"error: {status}: retriever anns:" in err
