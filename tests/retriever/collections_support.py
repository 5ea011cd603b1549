"""What the live-collection tests share: the retriever served in the test's event loop (`serving`,
Retrieve and Collections on loopback, the tiny index as the default collection), calls on its stubs,
files with made-up facts that only one file answers, and model-free content and vectors (`fake_content`,
`fake_embed`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from fpdf import FPDF

from protos import retriever_pb2 as pb
from retriever_svc.anns.backend import AnnsBackend
from retriever_svc.anns.index import AnnsIndex
from retriever_svc.collections.registry import CollectionRegistry, DefaultCollection
from retriever_svc.corpus.embedding import EMBEDDING_DIM
from tests.support.retrievers import RetrieverStubs, serving_retriever

SCHEDULE = (8, 32, 64)
ALL = 100                       # top_k that covers every passage of the collections made here
ADDED, REPLACED, UNCHANGED, FAILED = (pb.ADD_FILE_STATUS_ADDED, pb.ADD_FILE_STATUS_REPLACED,
                                      pb.ADD_FILE_STATUS_UNCHANGED, pb.ADD_FILE_STATUS_FAILED)
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "iris", "juniper", "kelp", "lumen",
         "maple", "nectar", "onyx", "pebble", "quartz", "raven", "sable", "thistle", "umber", "violet", "willow"]


# ---------------------------------------------------------------- serving in the test's event loop



@asynccontextmanager
async def serving(tiny_index: Path, root: Path) -> AsyncIterator[RetrieverStubs]:
    """The retriever as `serve` runs it, without the background merger (merges are asked for here); the default
    collection is the tiny index."""
    registry = CollectionRegistry(root, DefaultCollection(AnnsIndex(tiny_index)))
    backend = AnnsBackend(registry, schedule=SCHEDULE, beam_width=4)
    try:
        async with serving_retriever(backend, "anns") as stubs:
            yield stubs
    finally:
        registry.close()
        backend.index.close()


async def documents(stubs: RetrieverStubs, query: str, collection: str, top_k: int = 3) -> list:
    """The final list of a Retrieve."""
    request = pb.RetrieveRequest(query=query, top_k=top_k, collection=collection)
    chunks = [response.chunk async for response in stubs.retriever.Retrieve(request)]
    assert chunks and chunks[-1].final
    return list(chunks[-1].documents)


async def add_files(stubs: RetrieverStubs, collection: str,
                    files: list[tuple[str, bytes]]) -> list[pb.AddFilesResponse]:
    requests = [pb.AddFilesRequest(collection=collection, path=path, content=content) for path, content in files]
    return [response async for response in stubs.collections.AddFiles(iter(requests))]


async def infos(stubs: RetrieverStubs) -> dict[str, pb.CollectionInfo]:
    listed = await stubs.collections.ListCollections(pb.ListCollectionsRequest())
    return {info.name: info for info in listed.collections}


async def failure(call) -> grpc.aio.AioRpcError:
    """The error a call ends with (unary calls are awaited, streaming ones read to the end)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return caught.value


def from_file(document, path: str) -> bool:
    return document.url == path or document.url.startswith(path + "#")


# ---------------------------------------------------------------- made-up content, model-free vectors

def fake_content(path: str, version: int) -> bytes:
    """1-3 sections of about 150 words each (each its own passage), fixed by (path, version)."""
    rng = random.Random(f"{path}@{version}")
    sections = [f"## Part {s}\n\n" + " ".join(rng.choice(WORDS) for _ in range(150)) for s in range(rng.randint(1, 3))]
    return "\n\n".join(sections).encode()


def fake_embed(passages) -> np.ndarray:
    """A deterministic random unit vector per passage text."""
    vectors = []
    for passage in passages:
        seed = int.from_bytes(hashlib.sha256(passage.text.encode()).digest()[:8], "little")
        vector = np.random.default_rng(seed).standard_normal(EMBEDDING_DIM)
        vectors.append(vector / np.linalg.norm(vector))
    return np.asarray(vectors, dtype=np.float32).reshape(-1, EMBEDDING_DIM)



# ---------------------------------------------------------------- files with made-up facts

def pdf_bytes(*paragraphs: str) -> bytes:
    pdf = FPDF()
    pdf.set_font("helvetica", size=12)
    pdf.add_page()
    pdf.multi_cell(0, 8, "\n\n".join(paragraphs))
    return bytes(pdf.output())


ZORBLAX = ("# Zorblax engines\n\nThe zorblax engine of the airship Velmora burns purple quartz crystals "
           "instead of coal.\n\n## Upkeep\n\nIts crystals are polished with goat butter every seventh day.\n")
FERRIES = ("Quibbleton ferries\n==================\n\nThe ferries of Quibbleton sail only on Tuesdays, and only "
           "after the harbour bell has rung thirteen times.\n")
FERRIES_CHANGED = ("Quibbleton ferries\n==================\n\nThe ferries of Quibbleton are now pulled across the "
                   "bay by trained otters wearing brass harnesses.\n")
MARMALADE = ("Grandmother Ostrava's marmalade\n\nBoil eleven bitter oranges with a cup of smoked sea salt for "
             "exactly four hours, stirring with a cedar spoon.\n")
OBSERVATORY = ("<html><head><title>Kestrel Peak Observatory</title></head><body><h1>Kestrel Peak Observatory</h1>"
               "<p>The observatory on Kestrel Peak tracks the comet Harrow-9 with a telescope carved from glacier "
               "ice.</p></body></html>")
MOTHS = ("Lantern Moth Handbook.", "Lantern moths of the Brisk Valley glow blue whenever they smell cinnamon, "
         "and they migrate south every leap year.")
BADGERS = "# Badger choir\n\nThe badger choir of Millbrook sings only in D minor, and only during hailstorms.\n"
# file name -> (question answered by exactly that file)
QUESTIONS = {
    "zorblax.md": "What does the zorblax engine of the airship burn instead of coal?",
    "ferries.rst": "On which day do the ferries of Quibbleton sail?",
    "notes/marmalade.txt": "How long are the bitter oranges boiled for the marmalade?",
    "notes/observatory.html": "Which comet does the observatory on Kestrel Peak track?",
    "moths.pdf": "Why do lantern moths glow blue?",
    "notes-extra.md": "In which key does the badger choir of Millbrook sing?",
}


def write(path: Path, data: bytes | str) -> tuple[str, bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path), path.read_bytes()
