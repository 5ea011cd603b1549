"""A passage store without embeddings: the Python docs extracted and split, no embedding, no DiskANN.

What `streamrag trace synth --passages` reads (the traces draw their documents' text from it), in
about half a minute instead of the full index's embedding time:

    python -m load_tests.passages_only out/passages/passages.sqlite
    PASSAGES=out/passages/passages.sqlite bash scripts/bench_paper.sh out/nl traces
"""

from __future__ import annotations

import sys
from pathlib import Path

from retriever_svc.corpus import index as ix
from retriever_svc.corpus.store import write_store


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    params = ix.BuildParams()
    src = ix.DEFAULT_SOURCE
    count = ix.token_counter()
    passages = []
    files = ix.html_files(src)
    for p in files:
        page = ix.extract_html(p.read_text(encoding="utf-8", errors="replace"), p.relative_to(src).as_posix())
        passages.extend(ix.split_page(page, params.max_tokens, count))
    print(len(files), "pages ->", write_store(out, passages, {"note": "passages only"}), "passages")


if __name__ == "__main__":
    main(sys.argv[1:])
