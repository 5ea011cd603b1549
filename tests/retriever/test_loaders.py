"""Loading a user's own files (Markdown, reST, text, HTML, PDF) into pages, and refusing unreadable ones."""

from __future__ import annotations

import io
from pathlib import Path

import pypdf
import pytest
from fpdf import FPDF
from hypothesis import given, settings
from hypothesis import strategies as st

from retriever_svc.corpus.loaders import UnreadableFile, iter_files, load_page
from retriever_svc.corpus.passages import approx_tokens, split_page

MARKDOWN = """---
layout: post
title: "Field Notes"
---

Before any heading, a [linked phrase](https://example.org) and **bold** words
wrapped over two lines.

# Installing

Run the installer, then check `__version__`.

- first step
- second step

```python
# not a heading
def main():
    return 42
```

Configuration
=============

~~~
## not a heading either
~~~

Options live in one file. They are read once at start-up, and a change needs a restart of the
service; the defaults suit a laptop and a small server alike.

Troubleshooting
---------------

If it fails, read the log.

## Installing

A second heading with the same text gets its own anchor.
"""

RST = """==========
User Guide
==========

An introduction with ``literal`` text and a `link <https://example.org>`_.

.. this comment is dropped
   with its second line

.. _target-label:

Getting Started
---------------

Install it first::

    pip install thing

.. code-block:: python
   :caption: example

   import thing
   thing.run()

Advanced Use
~~~~~~~~~~~~

.. note:: Take care with the cache.

   Clear it after upgrades.
"""


def _pdf(*pages: str, title: str = "") -> bytes:
    pdf = FPDF()
    if title:
        pdf.set_title(title)
    pdf.set_font("helvetica", size=12)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 8, text)
    return bytes(pdf.output())


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def _load(path: Path):
    return load_page(str(path), path.read_bytes())


def test_markdown_sections_follow_headings_and_keep_code(tmp_path):
    page = _load(_write(tmp_path / "notes.md", MARKDOWN))
    assert page.title == "Field Notes"
    assert page.url == str(tmp_path / "notes.md")
    assert [(s.heading, s.anchor) for s in page.sections] == [
        ("", ""), ("Installing", "installing"), ("Configuration", "configuration"),
        ("Troubleshooting", "troubleshooting"), ("Installing", "installing-1")]
    intro, install, config, _, _ = page.sections
    assert "layout" not in intro.text and "---" not in intro.text
    assert intro.text == ("Before any heading, a linked phrase and bold words wrapped over two lines.")
    assert install.text.startswith("Installing\n\nRun the installer, then check __version__.")
    assert "- first step\n- second step" in install.text
    assert "# not a heading\ndef main():\n    return 42" in install.text
    assert "## not a heading either" in config.text
    for section in page.sections:
        assert "\n\n\n" not in section.text and not any(line != line.rstrip() for line in section.text.split("\n"))


def test_markdown_passages_carry_their_section_headings(tmp_path):
    page = _load(_write(tmp_path / "notes.md", MARKDOWN))
    passages = split_page(page, 64, approx_tokens)
    assert len(passages) > 1
    headed = {p.title for p in passages if "Field Notes \u2014 " in p.title}
    assert {"Field Notes \u2014 Installing", "Field Notes \u2014 Configuration"} <= headed
    assert any(p.url.endswith("#configuration") and "Options live in one file" in p.text for p in passages)


def test_markdown_title_is_the_first_h1_else_the_file_stem(tmp_path):
    assert _load(_write(tmp_path / "a.md", "Intro.\n\n## Minor\n\ntext\n\n# Major\n\nmore\n")).title == "Major"
    assert _load(_write(tmp_path / "how-to.MARKDOWN", "## Only minor\n\ntext\n")).title == "how-to"


def test_rst_titles_sections_and_directives(tmp_path):
    page = _load(_write(tmp_path / "guide.rst", RST))
    assert page.title == "User Guide"
    assert [(s.heading, s.anchor) for s in page.sections] == [
        ("User Guide", "user-guide"), ("Getting Started", "getting-started"), ("Advanced Use", "advanced-use")]
    guide, started, advanced = (s.text for s in page.sections)
    assert guide == "User Guide\n\nAn introduction with literal text and a link."
    assert "comment" not in guide and "target-label" not in started
    assert started == ("Getting Started\n\nInstall it first:\n\npip install thing\n\n"
                       "import thing\nthing.run()")
    assert advanced == "Advanced Use\n\nTake care with the cache.\n\nClear it after upgrades."


def test_plain_text_is_one_section_of_paragraphs(tmp_path):
    page = _load(_write(tmp_path / "todo.txt", "Shopping list\r\n\r\n\r\n  eggs   \r\n  milk\r\n\r\nThe end.  \r\n"))
    assert page.title == "Shopping list"
    assert [(s.heading, s.anchor, s.text) for s in page.sections] == [
        ("", "", "Shopping list\n\neggs\nmilk\n\nThe end.")]
    long_first_line = "word " * 30 + "\n\nsecond paragraph\n"
    assert _load(_write(tmp_path / "essay.text", long_first_line)).title == "essay"


def test_html_goes_through_the_html_extractor(tmp_path):
    html = ("<html><head><title>Recipes</title></head><body><h1>Recipes</h1><p>Soup first.</p>"
            "<section id='bread'><h2>Bread</h2><p>Knead the dough.</p></section></body></html>")
    page = _load(_write(tmp_path / "recipes.HTM", html))
    assert page.title == "Recipes"
    assert [(s.heading, s.anchor) for s in page.sections] == [("Recipes", ""), ("Bread", "bread")]
    assert page.sections[1].text == "Bread\n\nKnead the dough."
    fragment = _load(_write(tmp_path / "bare.html", "<p>No title or heading.</p>"))
    assert (fragment.title, fragment.sections[0].text) == ("bare", "No title or heading.")
    no_body = load_page("t.html", b"<html><head><title>T</title></head><p>Body left out.</p></html>")
    assert (no_body.title, no_body.sections[0].text) == ("T", "Body left out.")


def test_pdf_has_a_section_per_page_anchored_by_page_number(tmp_path):
    data = _pdf("Revenue grew in the northern region.", "Costs fell in the southern region.", title="Q3 Report")
    page = _load(_write(tmp_path / "q3.pdf", data))
    assert page.title == "Q3 Report"
    assert [(s.heading, s.anchor) for s in page.sections] == [("Page 1", "page=1"), ("Page 2", "page=2")]
    assert page.sections[0].text == "Page 1\n\nRevenue grew in the northern region."
    assert page.sections[1].text == "Page 2\n\nCosts fell in the southern region."
    assert [p.url for p in split_page(page, 12, approx_tokens)] == [f"{tmp_path / 'q3.pdf'}#page={n}" for n in (1, 2)]
    assert load_page("untitled.pdf", _pdf("Some text.")).title == "untitled"


def _encrypted(data: bytes, user_password: str) -> bytes:
    writer = pypdf.PdfWriter(clone_from=io.BytesIO(data))
    writer.encrypt(user_password, "owner secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_encrypted_pdf_is_refused_unless_the_empty_password_opens_it(tmp_path):
    data = _pdf("Confidential figures.")
    with pytest.raises(UnreadableFile, match="encrypted"):
        _load(_write(tmp_path / "locked.pdf", _encrypted(data, "secret")))
    page = _load(_write(tmp_path / "restricted.pdf", _encrypted(data, "")))
    assert page.sections[0].text == "Page 1\n\nConfidential figures."


@pytest.mark.parametrize("data", [b"", b"%PDF-1.7\n garbage \x00\xff" * 40, _pdf("Cut short.")[:300]],
                         ids=["empty", "garbage", "truncated"])
def test_corrupt_pdf_is_unreadable(tmp_path, data):
    with pytest.raises(UnreadableFile, match="PDF") as err:
        _load(_write(tmp_path / "broken.pdf", data))
    assert "\n" not in str(err.value)


def test_pdf_without_text_says_it_has_no_text_layer():
    with pytest.raises(UnreadableFile, match="no text layer"):
        load_page("scan.pdf", _pdf("", ""))


def test_binary_or_non_utf8_content_in_a_text_format_is_refused(tmp_path):
    with pytest.raises(UnreadableFile, match="binary file"):
        _load(_write(tmp_path / "data.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"))
    with pytest.raises(UnreadableFile, match="binary file"):
        load_page("latin1.md", "caf\u00e9 cr\u00e8me".encode("latin-1"))
    assert load_page("bom.md", "\ufeff# Caf\u00e9\n\ntext".encode()).title == "Caf\u00e9"
    assert load_page("utf16.txt", "hello\n\nworld".encode("utf-16")).title == "hello"


def test_unsupported_suffix_and_empty_files_are_refused():
    with pytest.raises(UnreadableFile, match=r"unsupported file type '\.docx'.*\.md.*\.pdf"):
        load_page("report.docx", b"PK\x03\x04")
    with pytest.raises(UnreadableFile, match="unsupported"):
        load_page("Makefile", b"all:\n")
    with pytest.raises(UnreadableFile, match="no text"):
        load_page("blank.md", b"\n   \n\n")


_MARKUP = st.sampled_from(["# ", "## x", "```", "~~~", "===", "---", "***", ".. ", ".. note:: a", ".. code-block::",
                           "::", "x::", "   ", "\t", "\n", "\n\n", "\r", "\xa0", "text", "- ", "1. ", "| a |", "`",
                           "``", "*", "_", "[a](b)", "> ", "title: t", "=====", "    code"])


# A file's text is what bytes decode to, so the draws are characters UTF-8 can encode: no lone surrogate
# (category Cs, '\ud800'), which no file can hold; NUL marks a binary file and is refused before the loaders.
_SCRAPS = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=4)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_MARKUP, _SCRAPS), max_size=30).map("".join), st.sampled_from(["a.md", "a.rst", "a.txt"]))
def test_any_text_loads_as_tidy_sections_or_is_refused_as_empty(text, name):
    try:
        page = load_page(name, text.encode())
    except UnreadableFile as err:
        assert str(err) == "no text in this file"
        return
    for section in page.sections:
        assert section.text.strip() and section.text.startswith(section.heading)
        assert "\n\n\n" not in section.text and all(line == line.rstrip() for line in section.text.split("\n"))


def test_iter_files_walks_folders_sorted_skipping_hidden_and_unsupported(tmp_path):
    for rel in ["b.md", "a/z.txt", "a/c.PDF", "a/deep/x.rst", "a/deep/image.png", ".git/config.md",
                "a/.cache/page.html", ".hidden.md", "notes.docx"]:
        _write(tmp_path / rel, "x")
    single = _write(tmp_path / "elsewhere" / "report.docx", "x")
    missing = tmp_path / "gone"
    found = list(iter_files([tmp_path, single, missing]))
    assert found == [(tmp_path / "a" / "c.PDF", None), (tmp_path / "a" / "deep" / "x.rst", None),
                     (tmp_path / "a" / "z.txt", None), (tmp_path / "b.md", None), (single, None),
                     (missing, "no such file or directory")]
