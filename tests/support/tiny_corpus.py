"""A handful of linked HTML pages: the smallest site a crawler or an indexer can work on."""

from __future__ import annotations

from pathlib import Path

PAGES: dict[str, tuple[str, str, list[str]]] = {
    # file: (title, body paragraphs joined, links)
    "index.html": ("Tiny Python Guide",
                   "This guide covers files, lists and dictionaries in Python.",
                   ["files.html", "lists.html", "dicts.html"]),
    "files.html": ("Reading and Writing Files",
                   "Use open() to read a file. The with statement closes the file for you. "
                   "Modes: 'r' reads text, 'w' writes text, 'rb' reads bytes.",
                   ["index.html", "io/buffering.html"]),
    "lists.html": ("Lists",
                   "A list is a mutable sequence. append() adds an item at the end; sort() sorts in place.",
                   ["index.html", "dicts.html"]),
    "dicts.html": ("Dictionaries",
                   "A dict maps keys to values. get() returns a default when the key is missing.",
                   ["index.html"]),
    "io/buffering.html": ("Buffering",
                          "Buffered I/O collects writes in memory and flushes them to the file in blocks.",
                          ["../files.html"]),
}


def render(title: str, body: str, links: list[str]) -> str:
    anchors = "\n".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
            f'<div class="body"><h1>{title}</h1>\n<p>{body}</p>\n<ul>{anchors}</ul></div></body></html>')


def build_tiny_corpus(root: Path) -> Path:
    for name, (title, body, links) in PAGES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(title, body, links), encoding="utf-8")
    return root


TOPICS = ["sorting lists", "reading files", "dictionary keys", "string formatting", "exceptions", "generators",
          "decorators", "classes", "modules", "regular expressions", "dates and times", "threads", "sockets",
          "json encoding", "csv files", "unit tests", "logging", "paths", "subprocesses", "random numbers"]
FILLER = ["returns", "a new", "value", "when", "the argument", "is", "missing", "and", "raises", "an error",
          "for each", "item", "in order", "with", "the default", "object", "that", "holds", "the result", "of it"]


def build_guide_pages(root: Path, count: int = 30, seed: int = 3) -> Path:
    """`count` linked pages of two sections each (about two passages a page): a site an index build takes a
    few seconds over, so a test can cut it short."""
    import random

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        topic = TOPICS[n % len(TOPICS)]
        sections = "".join(
            f'<section id="part-{s}"><h2>{topic.title()}, part {s}</h2><p>How to use {topic} in Python: '
            + " ".join(rng.choice(FILLER) for _ in range(120)) + f" ({topic} {n}.{s})</p></section>"
            for s in range(2))
        links = "".join(f'<a href="page-{(n + step) % count:03d}.html">next</a>' for step in (1, 7))
        (root / f"page-{n:03d}.html").write_text(
            f"<!DOCTYPE html><html><head><title>Guide {n}: {topic}</title></head><body><div class=\"body\">"
            f"<h1>Guide {n}: {topic}</h1>{sections}{links}</div></body></html>", encoding="utf-8")
    return root
