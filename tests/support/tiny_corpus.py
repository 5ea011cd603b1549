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
