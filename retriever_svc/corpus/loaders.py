"""A user's own file on disk -> a `Page` of text sections, like `extract.py` makes from HTML.

Markdown and reStructuredText start a section at every heading (anchor: GitHub's slug of it), plain
text is one section of paragraphs, HTML goes through `extract_html`, and a PDF has a section
per page (anchor `page=N`). Blocks are separated by one blank line and code keeps its lines,
so `passages.split_page` chunks these pages unchanged. A file that cannot be read raises
`UnreadableFile` whose message says why in one line (the caller adds the file's name).
"""

from __future__ import annotations

import codecs
import io
import logging
import os
import re
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

import pypdf
import pypdf.errors

from retriever_svc.corpus.extract import Page, Section, extract_html

SUPPORTED = {".md": "markdown", ".markdown": "markdown", ".rst": "rst", ".txt": "text", ".text": "text",
             ".html": "html", ".htm": "html", ".pdf": "pdf"}
TITLE_MAX_CHARS = 80        # a plain text file's first line is its title when no longer than this
_ITEM_START = re.compile(r"(?:[-*+\u2022]\s|\d{1,9}[.)]\s|#\.\s|\|)")   # starts its own line in a block
_ADORNMENT = re.compile(r"([!-/:-@\[-`{-~])\1+\s*$")   # an rst title's under/overline
_MD_FENCE = re.compile(r"\s*(`{3,}|~{3,})")
_MD_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_MD_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_MD_BREAK = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_MD_LINK_DEF = re.compile(r" {0,3}\[[^\]]+\]:\s+\S")
_MD_TABLE_RULE = re.compile(r"\|?(?:\s*:?-+:?\s*\|)+\s*:?-*:?\s*$")
_MD_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_MD_INLINE = [(re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),                  # image -> alt text
              (re.compile(r"\[([^\]]+)\](?:\([^)]*\)|\[[^\]]*\])"), r"\1"),    # link -> its text
              (re.compile(r"<((?:https?|mailto):[^>\s]+)>"), r"\1"),
              (re.compile(r"(\*{1,3}|~~)(?=\S)(.+?)(?<=\S)\1"), r"\2"),
              (re.compile(r"(?<!\w)(_{1,3})(?=\S)(.+?)(?<=\S)\1(?!\w)"), r"\2"),
              (re.compile(r"\\([!-/:-@\[-`{-~])"), r"\1")]
_MD_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_RST_EXPLICIT = re.compile(r"\.\.(?:\s|$)")
_RST_DIRECTIVE = re.compile(r"\.\.\s+([\w+.-]+(?::[\w+.-]+)*)::(?:\s+(.*))?$")
_RST_FOOTNOTE = re.compile(r"\.\.\s+\[[^\]]+\]\s+(.*)$")
_RST_OPTION = re.compile(r":[\w -]+:(?:\s.*)?$")
_RST_INLINE = [(re.compile(r":[\w:+.-]+:`([^`]+)`"), r"`\1`"),             # :role:`x` -> `x`
               (re.compile(r"`([^`<]*?)\s*<[^`>]+>`_{0,2}"), r"\1"),        # `text <target>`_ -> text
               (re.compile(r"`[~!]?([^`]+)`_{0,2}"), r"\1"),
               (re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*"), r"\1"),
               (re.compile(r"\*(?=\S)(.+?)(?<=\S)\*"), r"\1"),
               (re.compile(r"\s?\[[#*\w-]*\]_"), "")]                        # footnote references
_RST_LITERAL = re.compile(r"``(.+?)``")
RST_CODE_DIRECTIVES = frozenset({"code-block", "code", "sourcecode", "doctest", "testcode", "parsed-literal"})
RST_SKIPPED_DIRECTIVES = frozenset({"toctree", "image", "include", "literalinclude", "raw", "meta", "contents",
                                    "sectnum", "highlight", "index", "role", "default-role", "currentmodule"})

_ENCRYPTED = "the PDF is encrypted (password-protected); index an unencrypted copy"

logging.getLogger("pypdf").setLevel(logging.ERROR)   # broken files log a warning per bad object


class UnreadableFile(ValueError):
    """One clear, user-facing line: why this file cannot be indexed."""


@dataclass
class _Block:
    text: str
    heading_level: int = 0      # 0: body text; 1-6: a heading that starts a section


def load_page(name: str, data: bytes) -> Page:
    """The file's text as a `Page`; `name` (its path as the user knows it) is the URL and picks the format."""
    suffix = PurePath(name).suffix.lower()
    fmt = SUPPORTED.get(suffix)
    if fmt is None:
        supported = ", ".join(sorted(SUPPORTED))
        raise UnreadableFile(f"unsupported file type {suffix or '(no suffix)'!r} (supported: {supported})")
    try:
        page = _load_pdf(name, data) if fmt == "pdf" else _load_text(name, fmt, _decode(data, fmt))
    except UnreadableFile:
        raise
    except Exception as exc:     # pypdf raises all sorts on malformed files
        raise UnreadableFile(f"not a readable {fmt} file ({_one_line(exc)})") from exc
    if not any(section.text.strip() for section in page.sections):
        raise UnreadableFile("no text layer in this PDF (a scanned document? run OCR on it first)"
                             if fmt == "pdf" else "no text in this file")
    return page


def iter_files(paths: Iterable[Path]) -> Iterator[tuple[Path, str | None]]:
    """Each file as given, each folder's supported files (sorted, hidden ones skipped), with an error line or None."""
    for path in paths:
        if path.is_dir():
            yield from _walk(path)
        elif path.is_file():
            yield path, None
        elif path.exists():
            yield path, "not a regular file or directory"
        else:
            yield path, "no such file or directory"


def _walk(root: Path) -> Iterator[tuple[Path, str | None]]:
    found: list[tuple[Path, str | None]] = []

    def unreadable(err: OSError) -> None:
        found.append((Path(err.filename or root), (err.strerror or str(err)).lower()))

    for folder, dirs, files in os.walk(root, onerror=unreadable):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend((Path(folder, f), None) for f in files
                     if not f.startswith(".") and PurePath(f).suffix.lower() in SUPPORTED)
    return iter(sorted(found, key=lambda item: item[0]))


def _one_line(exc: Exception) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _decode(data: bytes, fmt: str) -> str:
    try:
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            return data.decode("utf-16")
        if b"\x00" not in data:
            return data.decode("utf-8-sig")     # also plain UTF-8
    except UnicodeDecodeError:
        pass
    raise UnreadableFile(f"binary file (not UTF-8 text), cannot be read as {fmt}")


def _load_text(name: str, fmt: str, text: str) -> Page:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    stem = PurePath(name).stem
    if fmt == "html":
        page = extract_html(_with_body(text), name)
        return Page(name, stem if page.title == name else page.title, page.sections)   # not the whole path
    if fmt == "text":
        return _plain_page(name, stem, text)
    if fmt == "markdown":
        title, lines = _front_matter_title(text.split("\n"))
        blocks = list(_markdown_blocks(lines))
        title = title or next((b.text for b in blocks if b.heading_level == 1 and b.text), stem)
        return _page(name, title, blocks)
    blocks = list(_rst_blocks(text.expandtabs(8).split("\n")))   # indentation is spaces from here
    return _page(name, next((b.text for b in blocks if b.heading_level and b.text), stem), blocks)


def _with_body(html: str) -> str:
    """HTML may leave out `<body>`; `extract_html` reads only inside it."""
    if re.search(r"<body[\s>]", html, re.IGNORECASE):
        return html
    head_end = re.search(r"</head\s*>", html, re.IGNORECASE)
    cut = head_end.end() if head_end else 0
    return f"{html[:cut]}<body>{html[cut:]}</body>"


def _page(name: str, title: str, blocks: list[_Block]) -> Page:
    """Group blocks into sections, one per heading, each starting with its heading."""
    groups: list[tuple[str, str, list[str]]] = [("", "", [])]
    seen: dict[str, int] = {}
    for block in (b for b in blocks if b.text):
        if block.heading_level:
            anchor = _slug(block.text)
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            groups.append((block.text, f"{anchor}-{n}" if n else anchor, [block.text]))
        else:
            groups[-1][2].append(block.text)
    sections = [Section(heading, anchor, "\n\n".join(texts)) for heading, anchor, texts in groups if texts]
    return Page(name, title, sections)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _prose(lines: list[str], inline: Callable[[str], str]) -> str:
    """A paragraph's lines joined by spaces, except list items and table rows keep their own lines."""
    out: list[str] = []
    for raw in lines:
        line = " ".join(raw.split())
        if not line:
            continue
        if out and not _ITEM_START.match(line) and not out[-1].startswith("|"):
            out[-1] += " " + line
        else:
            out.append(line)
    return _squeezed([inline(line) for line in out])


def _code(lines: list[str]) -> str:
    """Code keeps its lines and indentation; blank lines go, so it stays one block."""
    return "\n".join(line.rstrip() for line in textwrap.dedent("\n".join(lines)).split("\n") if line.strip())


def _squeezed(lines: list[str]) -> str:
    """Lines with runs of spaces collapsed, empty ones dropped."""
    return "\n".join(line for line in (" ".join(raw.split()) for raw in lines) if line)


def _plain_page(name: str, stem: str, text: str) -> Page:
    blocks = [_code(para.split("\n")) for para in re.split(r"\n\s*\n", text)]
    body = "\n\n".join(block for block in blocks if block)
    first = body.split("\n", 1)[0].strip()
    title = first if first and len(first) <= TITLE_MAX_CHARS else stem
    return Page(name, title, [Section("", "", body)] if body else [])


def _front_matter_title(lines: list[str]) -> tuple[str, list[str]]:
    """YAML front matter (`---` ... `---` at the top) dropped; its `title:`, if any."""
    if not lines or lines[0].strip() != "---":
        return "", lines
    for end in range(1, len(lines)):
        if lines[end].strip() in ("---", "..."):
            titles = [m[1] for line in lines[1:end] if (m := re.match(r"title:\s*(.+?)\s*$", line))]
            return (titles[0].strip("'\"") if titles else ""), lines[end + 1:]
    return "", lines


def _md_inline(line: str) -> str:
    parts = _MD_CODE_SPAN.split(line)    # text, ticks, code, text, ticks, code, ...
    for i in range(0, len(parts), 3):
        for pattern, repl in _MD_INLINE:
            parts[i] = pattern.sub(repl, parts[i])
    return "".join(part if i % 3 != 1 else "" for i, part in enumerate(parts))


def _md_paragraph(lines: list[str]) -> _Block:
    lines = [_MD_QUOTE.sub("", line, count=1) for line in lines if not _MD_TABLE_RULE.match(line)]
    if all(line.startswith(("    ", "\t")) for line in lines):
        return _Block(_code(lines))       # an indented code block
    return _Block(_prose(lines, _md_inline))


def _markdown_blocks(lines: list[str]) -> Iterator[_Block]:
    para: list[str] = []
    fence, code = "", []
    for line in lines:
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                yield _Block(_code(code))
                fence, code = "", []
            else:
                code.append(line)
        elif para and not _ITEM_START.match(para[0].lstrip()) and (underline := _MD_SETEXT.match(line)):
            yield _Block(_squeezed([_md_inline(" ".join(para))]), 1 if underline[1][0] == "=" else 2)
            para = []
        elif stripped and not any(p.match(line) for p in (_MD_ATX, _MD_FENCE, _MD_BREAK, _MD_LINK_DEF)):
            para.append(line)
        else:
            if para:
                yield _md_paragraph(para)
                para = []
            if heading := _MD_ATX.match(line):
                text = re.sub(r"(?:^|[ \t]+)#+$", "", heading[2] or "")
                yield _Block(_squeezed([_md_inline(text)]), len(heading[1]))
            elif opening := _MD_FENCE.match(line):
                fence = opening[1]
    if para:
        yield _md_paragraph(para)
    if code:
        yield _Block(_code(code))       # an unclosed fence runs to the end


def _rst_inline(line: str) -> str:
    parts = _RST_LITERAL.split(line)     # text, literal, text, ...
    for i in range(0, len(parts), 2):
        for pattern, repl in _RST_INLINE:
            parts[i] = pattern.sub(repl, parts[i])
    return "".join(parts)


def _rst_title(lines: list[str], i: int) -> tuple[str, int] | None:
    """The section title at line `i` (underlined, or over- and underlined) and the lines it takes."""
    line = lines[i]
    after = lines[i + 1] if i + 1 < len(lines) else ""
    if _ADORNMENT.match(line) and i + 2 < len(lines):
        title, under = after.strip(), lines[i + 2].rstrip()
        if title and under == line.rstrip() and len(under) >= len(title):
            return title, 3
    title = line.rstrip()
    if title and not title.startswith(" ") and not _ADORNMENT.match(title) and _ADORNMENT.match(after) \
            and len(after.rstrip()) >= len(title):
        return title, 2
    return None


def _indented(lines: list[str], start: int) -> tuple[list[str], int]:
    """The indented (or blank) lines from `start`, dedented, and the index after them."""
    end = start
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
        end += 1
    return textwrap.dedent("\n".join(lines[start:end])).split("\n"), end


def _rst_explicit(line: str, body: list[str]) -> list[_Block]:
    """A `.. ` construct: directives keep their text, comments and targets go."""
    if note := _RST_FOOTNOTE.match(line):
        return list(_rst_blocks([note[1], *body]))
    directive = _RST_DIRECTIVE.match(line)
    if not directive:
        return []
    name, args = directive[1].lower(), directive[2] or ""
    while body and _RST_OPTION.match(body[0]):
        body = body[1:]
    if name in RST_CODE_DIRECTIVES:
        return [_Block(_code(body))]
    if name in RST_SKIPPED_DIRECTIVES:
        return []
    head = [_Block(_rst_inline(" ".join(args.split())))] if args.strip() and name != "figure" else []
    return head + list(_rst_blocks(body))


def _rst_paragraph(lines: list[str]) -> _Block:
    """A paragraph; a trailing "::" (announcing a literal block) becomes ":" or goes."""
    text = re.sub(r"(\S)::$", r"\1:", _prose(lines, _rst_inline))
    return _Block(re.sub(r"\s*::$", "", text))


def _rst_blocks(lines: list[str]) -> Iterator[_Block]:
    para: list[str] = []
    literal = False            # the last paragraph ended with "::": an indented block after it is code
    i = 0
    while i < len(lines):
        line = lines[i]
        if para and (not line.strip() or _RST_EXPLICIT.match(line) or _is_transition(line)):
            literal = para[-1].rstrip().endswith("::")
            yield _rst_paragraph(para)
            para = []
            i += 1 if _is_transition(line) else 0
            continue
        title = None if para else _rst_title(lines, i)
        if title:
            yield _Block(_squeezed([_rst_inline(title[0])]), 1)
            i += title[1]
        elif _RST_EXPLICIT.match(line):
            body, i = _indented(lines, i + 1)
            yield from _rst_explicit(line, body)
        elif line.strip() and line.startswith(" ") and not para:
            body, i = _indented(lines, i)
            yield from [_Block(_code(body))] if literal else _rst_blocks(body)
        else:
            if line.strip() and not _is_transition(line):
                para.append(line)
            i += 1
            continue
        literal = False
    if para:
        yield _rst_paragraph(para)


def _is_transition(line: str) -> bool:
    return bool(_ADORNMENT.match(line)) and len(line.strip()) >= 4


def _load_pdf(name: str, data: bytes) -> Page:
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnreadableFile(_ENCRYPTED)
        sections = []
        for number, pdf_page in enumerate(reader.pages, start=1):
            blocks = [_squeezed(para.split("\n")) for para in re.split(r"\n\s*\n", pdf_page.extract_text() or "")]
            body = "\n\n".join(block for block in blocks if block)
            if body:
                sections.append(Section(f"Page {number}", f"page={number}", f"Page {number}\n\n{body}"))
        title = (reader.metadata.title if reader.metadata else None) or ""
    except pypdf.errors.FileNotDecryptedError as exc:
        raise UnreadableFile(_ENCRYPTED) from exc
    except pypdf.errors.DependencyError as exc:
        raise UnreadableFile(f"the PDF is encrypted and cannot be decrypted here ({_one_line(exc)})") from exc
    except pypdf.errors.PyPdfError as exc:
        raise UnreadableFile(f"corrupt or unreadable PDF ({_one_line(exc)})") from exc
    return Page(name, " ".join(str(title).split()) or PurePath(name).stem, sections)
