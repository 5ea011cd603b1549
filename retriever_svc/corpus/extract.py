"""HTML page -> title, URL path and text sections (one per heading), with no markup left.

Made for Sphinx output such as the Python documentation: the text comes from the main
content (`<div role="main">` or `<div class="body">`, else the whole `<body>`), navigation,
scripts and permalink marks are dropped, and every heading (h1-h6) starts a section whose
anchor is the enclosing `<section id=...>`. Blocks (paragraphs, list items, definitions,
code) are separated by blank lines; code keeps its line breaks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

BLOCK_TAGS = frozenset({"p", "pre", "div", "dl", "dt", "dd", "ul", "ol", "li", "table", "tr", "blockquote",
                        "section", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "br", "figure", "caption"})
HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template"})
# Generated listings (top level) with no prose of their own: indexes, search, the table of contents.
SKIPPED_PAGES = ("genindex*.html", "search.html", "py-modindex.html", "contents.html")
_SPACES = re.compile(r"[ \t\r\f\v\n]+")
_LINE = "\x00"     # a line break inside a block (code, table rows)
_TERM = "\x01"     # marks a block to be joined with the next one


@dataclass
class Section:
    heading: str           # "" for text before the page's first heading
    anchor: str            # the section's id ("" when the page has none)
    text: str              # blocks separated by blank lines; starts with the heading


@dataclass
class Page:
    url: str               # path relative to the corpus root, e.g. "library/json.html"
    title: str
    sections: list[Section] = field(default_factory=list)


def clean_title(title: str) -> str:
    """Drop Sphinx's " — Python 3.11.2 documentation" suffix."""
    title = _SPACES.sub(" ", title).strip()
    head, sep, tail = title.rpartition(" \u2014 ")
    return head if sep and tail.lower().endswith("documentation") else title


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title_parts: list[str] = []
        self.sections: list[tuple[str, str, list[str]]] = [("", "", [])]  # heading, anchor, text pieces
        self.heading_parts: list[str] | None = None
        self.in_title = self.in_body = False
        self.skip_depth = 0        # inside script/style or a permalink mark
        self.pre_depth = 0
        self.div_depth = 0
        self.main_depth: int | None = None    # div depth of the main content, once found
        self.saw_main = False
        self.pending_anchor = ""
        self.table_depth = 0       # a table is one block, a row per line, cells joined by " | "
        self.first_cell = False

    # The main content, when the page marks one, is all that counts.
    def _collecting(self) -> bool:
        return self.in_body and self.skip_depth == 0 and (self.main_depth is not None or not self.saw_main)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "title":
            self.in_title = True
        elif tag == "body":
            self.in_body = True
        elif tag in SKIPPED_TAGS or (tag == "a" and "headerlink" in (attr.get("class") or "").split()):
            self.skip_depth += 1
            return
        if tag == "div":
            self.div_depth += 1
            classes = (attr.get("class") or "").split()
            if self.main_depth is None and (attr.get("role") == "main" or "body" in classes):
                if self.saw_main is False:
                    self.sections = [("", "", [])]   # anything before the main content was navigation
                self.main_depth, self.saw_main = self.div_depth, True
        elif tag == "section" and attr.get("id"):
            self.pending_anchor = attr["id"] or ""
        elif tag == "pre":
            self.pre_depth += 1
        if tag in HEADINGS and self._collecting():
            self.sections.append(("", self.pending_anchor, []))
            self.pending_anchor = ""
            self.heading_parts = []
        if self._collecting():
            self.sections[-1][2].append(self._separator(tag, start=True))
        if tag == "table":
            self.table_depth += 1

    def _separator(self, tag: str, start: bool) -> str:
        if not self.table_depth or tag == "table":
            if tag == "dt" and start:
                return "\n\n" + _TERM   # a term (or signature) stays with its definition
            return "\n\n" if tag in BLOCK_TAGS else ""
        if tag == "tr":
            self.first_cell = True
            return _LINE
        if tag in ("td", "th") and start:
            sep = "" if self.first_cell else " | "
            self.first_cell = False
            return sep
        return " " if tag in BLOCK_TAGS else ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        elif tag == "body":
            self.in_body = False
        elif tag in SKIPPED_TAGS or (tag == "a" and self.skip_depth):
            self.skip_depth = max(0, self.skip_depth - 1)
            return
        if tag == "table":
            self.table_depth = max(0, self.table_depth - 1)
        if self._collecting():
            self.sections[-1][2].append(self._separator(tag, start=False))
        if tag in HEADINGS and self.heading_parts is not None:
            _, anchor, pieces = self.sections[-1]
            self.sections[-1] = (_SPACES.sub(" ", "".join(self.heading_parts)).strip(), anchor, pieces)
            self.heading_parts = None
        if tag == "pre":
            self.pre_depth = max(0, self.pre_depth - 1)
        elif tag == "div":
            if self.main_depth is not None and self.div_depth == self.main_depth:
                self.main_depth = None
            self.div_depth = max(0, self.div_depth - 1)

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title_parts.append(data)
        if not self._collecting():
            return
        if self.heading_parts is not None:
            self.heading_parts.append(data)
        # Outside <pre>, line breaks are just spaces; inside, they mark code lines (kept as "\n").
        self.sections[-1][2].append(data.replace("\n", _LINE) if self.pre_depth else _SPACES.sub(" ", data))


def _blocks(pieces: list[str]) -> str:
    blocks: list[str] = []
    term = ""
    for raw in "".join(pieces).split("\n\n"):
        is_term = raw.startswith(_TERM)
        lines = [_SPACES.sub(" ", line).strip() for line in raw.replace(_TERM, "").split(_LINE)]
        block = "\n".join(line for line in lines if line)
        if not block:
            continue
        block = f"{term}\n{block}" if term else block
        term = block if is_term else ""
        if not is_term:
            blocks.append(block)
    if term:
        blocks.append(term)
    return "\n\n".join(blocks)


def extract_html(html: str, url: str) -> Page:
    """Parse one page; `url` is its path relative to the corpus root."""
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    title = clean_title("".join(parser.title_parts))
    sections = []
    for heading, anchor, pieces in parser.sections:
        text = _blocks(pieces)
        if text:
            sections.append(Section(heading, anchor, text))
    if not title:
        title = next((s.heading for s in sections if s.heading), url)
    return Page(url, title, sections)


def html_files(root: Path) -> list[Path]:
    """The corpus's pages: every `*.html` under `root`, minus generated listings and `_*` folders."""
    files = []
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root)
        if any(part.startswith("_") for part in rel.parts[:-1]):
            continue
        if any(rel.match(pattern) for pattern in SKIPPED_PAGES) and len(rel.parts) == 1:
            continue
        files.append(path)
    return files


def extract_tree(root: Path) -> Iterator[Page]:
    """Every page of the corpus under `root`, in path order."""
    for path in html_files(root):
        yield extract_html(path.read_text(encoding="utf-8", errors="replace"), path.relative_to(root).as_posix())
