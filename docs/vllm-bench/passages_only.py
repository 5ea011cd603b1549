# python docs/vllm-bench/passages_only.py out/passages/passages.sqlite   (from the repository root)
# Passage store only (extract + split, no embedding, no DiskANN): what `trace synth` reads.
import sys
from pathlib import Path

from retriever_svc.corpus import index as ix
from retriever_svc.corpus.store import write_store

out = Path(sys.argv[1])
out.parent.mkdir(parents=True, exist_ok=True)
params = ix.BuildParams()
src = ix.DEFAULT_SOURCE
count = ix._token_counter()
passages = []
files = ix.html_files(src)
for p in files:
    page = ix.extract_html(p.read_text(encoding="utf-8", errors="replace"), p.relative_to(src).as_posix())
    passages.extend(ix.split_page(page, params.max_tokens, count))
print(len(files), "pages ->", write_store(out, passages, {"note": "passages only"}), "passages")
