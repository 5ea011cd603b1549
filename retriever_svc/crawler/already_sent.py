"""What a crawl has already sent, so that no page repeats it: URLs, whole pages and lines.

A page is a repeat when its URL (or the one it redirected to) or its whole text (white space
and case folded) was kept before. A page that is new still leaves out each line (a paragraph,
item or heading of `MIN_DEDUP_LINE_CHARS` or more) that an earlier kept page sent, so the
navigation and boilerplate that pages share are sent once.
"""

from __future__ import annotations

import hashlib

MIN_DEDUP_LINE_CHARS = 20          # shorter lines (code, short headings) may repeat across pages


def text_digest(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).lower().encode("utf-8")).hexdigest()


class AlreadySent:
    def __init__(self) -> None:
        self.urls: set[str] = set()
        self.pages: set[str] = set()
        self.lines: set[str] = set()

    def repeats(self, urls: set[str], text: str) -> bool:
        """Whether a page at `urls` with `text` was kept before (by URL or by content)."""
        return bool(urls & self.urls) or text_digest(text) in self.pages

    def add(self, urls: set[str], text: str) -> None:
        self.urls |= urls
        self.pages.add(text_digest(text))

    def unsent_lines(self, text: str) -> str:
        """`text` without the long lines an earlier kept page sent (and remembering its own)."""
        kept = []
        for line in text.splitlines():
            if len(line.strip()) >= MIN_DEDUP_LINE_CHARS:
                digest = text_digest(line)
                if digest in self.lines:
                    continue
                self.lines.add(digest)
            kept.append(line)
        return "\n".join(kept)
