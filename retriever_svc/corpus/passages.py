"""Pack a page's sections into passages of at most `max_tokens` tokens, split at section boundaries.

Small consecutive sections share a passage. A section too long for one passage gets passages
of its own (a short passage before it, such as a lone heading, leads its first one), cut
between blocks (paragraphs, definitions, code), and only when one block is itself too long,
between its lines, sentences or words. A passage continuing a section starts with the
section's heading again, so each passage reads (and embeds) on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from retriever_svc.corpus.extract import Page, Section

# all-MiniLM-L6-v2 reads 256 word pieces; the title goes in front of the text when embedding.
DEFAULT_MAX_TOKENS = 224
MIN_TOKENS = 48             # a passage this short joins the next section's first passage
TokenCounter = Callable[[str], int]
_APPROX_TOKEN = re.compile(r"\w+|[^\w\s]")
_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+")


@dataclass(frozen=True)
class Passage:
    id: str          # "<page url>:<n>", stable while the page does not change
    title: str       # page title, plus " — <section heading>" when they differ
    url: str         # page url, plus "#<anchor>" of the passage's first section
    text: str


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate: words and punctuation marks."""
    return len(_APPROX_TOKEN.findall(text))


def _split_long(text: str, max_tokens: int, count: TokenCounter) -> list[str]:
    """Cut one over-long block into pieces that fit: by lines, then sentences, then words."""
    for splitter in (lambda t: t.split("\n"), _SENTENCE_END.split, str.split):
        parts = [p for p in splitter(text) if p.strip()]
        if len(parts) > 1:
            break
    else:
        return [text]      # one unbreakable word: the embedder truncates it
    joiner = "\n" if "\n" in text else " "
    return list(_pack(parts, max_tokens, count, joiner))


def _pack(parts: Iterable[str], max_tokens: int, count: TokenCounter, joiner: str) -> Iterator[str]:
    """Greedily join consecutive parts while they fit; recurse into parts that never fit."""
    current: list[str] = []
    used = 0
    for part in parts:
        n = count(part)
        if n > max_tokens:
            if current:
                yield joiner.join(current)
                current, used = [], 0
            if len(part.split()) > 1 or "\n" in part:
                yield from _split_long(part, max_tokens, count)
            else:
                yield part
            continue
        if current and used + n > max_tokens:
            yield joiner.join(current)
            current, used = [], 0
        current.append(part)
        used += n
    if current:
        yield joiner.join(current)


def _section_chunks(section: Section, max_tokens: int, count: TokenCounter) -> list[str]:
    heading_tokens = count(section.heading) if section.heading else 0
    blocks = section.text.split("\n\n")
    if section.heading and blocks and blocks[0] == section.heading:
        blocks = blocks[1:]
    chunks = list(_pack(blocks, max(16, max_tokens - heading_tokens), count, "\n\n"))
    return [f"{section.heading}\n\n{chunk}" if section.heading else chunk for chunk in chunks]


def split_page(page: Page, max_tokens: int = DEFAULT_MAX_TOKENS,
               count_tokens: TokenCounter = approx_tokens) -> list[Passage]:
    """The page's passages, in reading order."""
    groups: list[tuple[Section, list[str]]] = []     # (first section, texts) per passage
    used = 0
    for section in page.sections:
        n = count_tokens(section.text)
        if n <= max_tokens:
            if groups and used + n <= max_tokens:
                groups[-1][1].append(section.text)
                used += n
            else:
                groups.append((section, [section.text]))
                used = n
            continue
        if groups and used < MIN_TOKENS:
            # A lone heading (or a line) before a long section leads the section's first passage.
            chunks = _section_chunks(section, max_tokens - used, count_tokens)
            groups[-1][1].append(chunks.pop(0))
        else:
            chunks = _section_chunks(section, max_tokens, count_tokens)
        groups.extend((section, [chunk]) for chunk in chunks)
        used = max_tokens + 1      # nothing joins the tail of a split section
    passages = []
    for i, (section, texts) in enumerate(groups):
        title = page.title
        if section.heading and section.heading != page.title:
            title = f"{page.title} \u2014 {section.heading}"
        url = f"{page.url}#{section.anchor}" if section.anchor else page.url
        passages.append(Passage(f"{page.url}:{i}", title, url, "\n\n".join(texts)))
    return passages
