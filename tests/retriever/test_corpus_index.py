"""Corpus extraction, passage splitting and `index build` (real embedder, real DiskANN, tiny corpus)."""

from __future__ import annotations

import argparse
import json
import re

from retriever_svc.corpus.extract import Page, Section, clean_title, extract_html, extract_tree, html_files
from retriever_svc.corpus.index import MANIFEST, STORE, add_index_build_args, build_index, run_index_build
from retriever_svc.corpus.passages import approx_tokens, split_page
from retriever_svc.corpus.store import PassageStore
from tests.support.tiny_corpus import PAGES

SPHINX_PAGE = """<!DOCTYPE html><html><head><title>json — JSON encoder &#8212; Python 3.11.2 documentation</title>
<script>var navigation = "script text";</script></head><body>
<nav><a href="index.html">Navigation bar</a></nav>
<div class="document"><div class="documentwrapper"><div class="body" role="main">
<section id="module-json"><h1>json — JSON encoder<a class="headerlink" href="#module-json">¶</a></h1>
<p>JSON is a <em>lightweight</em>
data interchange format.</p>
<div class="highlight"><pre><span>import json</span>
<span>json.dumps([1, 2])</span></pre></div>
<section id="basic-usage"><h2>Basic Usage<a class="headerlink" href="#basic-usage">¶</a></h2>
<dl><dt>json.dump(obj, fp)</dt><dd><p>Serialize obj to fp.</p></dd></dl>
<table><tr><th>JSON</th><th>Python</th></tr><tr><td><p>object</p></td><td><p>dict</p></td></tr></table>
</section></section></div></div>
<div class="sphinxsidebar">Sidebar table of contents</div></div>
<div class="footer">Copyright footer</div></body></html>"""


def test_extracts_tiny_corpus_titles_url_paths_and_text_without_html(tiny_corpus):
    pages = list(extract_tree(tiny_corpus))
    assert {p.url: p.title for p in pages} == {name: title for name, (title, _, _) in PAGES.items()}
    for page in pages:
        text = "\n".join(s.text for s in page.sections)
        assert PAGES[page.url][1] in " ".join(text.split())
        assert not re.search(r"<[a-zA-Z/!]", text), text
        assert "&#" not in text and "&amp;" not in text


def test_extracts_sphinx_sections_keeps_code_lines_and_drops_navigation():
    page = extract_html(SPHINX_PAGE, "library/json.html")
    assert page.title == "json — JSON encoder"
    assert [(s.heading, s.anchor) for s in page.sections] == [
        ("json — JSON encoder", "module-json"), ("Basic Usage", "basic-usage")]
    intro, usage = (s.text for s in page.sections)
    assert "JSON is a lightweight data interchange format." in intro
    assert "import json\njson.dumps([1, 2])" in intro
    assert "json.dump(obj, fp)\nSerialize obj to fp." in usage       # a term stays with its definition
    assert "JSON | Python\nobject | dict" in usage
    everything = intro + usage
    for dropped in ("¶", "script text", "Navigation bar", "Sidebar", "footer"):
        assert dropped not in everything


def test_clean_title_and_skipped_listing_pages(tmp_path):
    assert clean_title("Lists — Python 3.11.2 documentation") == "Lists"
    assert clean_title("3.11.2 Documentation") == "3.11.2 Documentation"
    for name in ("genindex.html", "genindex-A.html", "search.html", "_static/x.html", "library/a.html"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("<p>x</p>")
    assert [p.relative_to(tmp_path).as_posix() for p in html_files(tmp_path)] == ["library/a.html"]


def test_split_packs_small_sections_and_splits_long_ones_between_blocks():
    para = " ".join(f"word{i}" for i in range(30)) + "."
    long_text = "Long\n\n" + "\n\n".join(f"{para} block {b}" for b in range(12))
    intro = "Guide\n\nShort intro, long enough not to be a lone heading: " + " ".join(["text"] * 40)
    page = Page("guide.html", "Guide", [
        Section("Guide", "top", intro), Section("Small", "small", "Small\n\nA small section."),
        Section("Long", "long", long_text), Section("After", "after", "After\n\nThe end.")])
    passages = split_page(page, max_tokens=100, count_tokens=approx_tokens)
    assert [p.id for p in passages] == [f"guide.html:{i}" for i in range(len(passages))]
    assert passages[0].text == intro + "\n\nSmall\n\nA small section."         # small sections share
    assert passages[0].url == "guide.html#top" and passages[0].title == "Guide"
    long_parts = passages[1:-1]
    assert len(long_parts) >= 3 and all(p.text.startswith("Long\n\n") for p in long_parts)
    assert all(p.url == "guide.html#long" and p.title == "Guide — Long" for p in long_parts)
    assert all(approx_tokens(p.text) <= 100 for p in passages)
    body = "\n\n".join(p.text.removeprefix("Long\n\n") for p in long_parts)
    assert body == long_text.removeprefix("Long\n\n")                   # nothing lost, order kept
    assert passages[-1].url == "guide.html#after"                       # no section joins a split one's tail


def test_a_lone_heading_leads_the_next_long_section():
    para = " ".join(f"word{i}" for i in range(30)) + "."
    long_text = "Long\n\n" + "\n\n".join([para] * 6)
    page = Page("p.html", "P", [Section("Parent", "parent", "Parent"), Section("Long", "long", long_text)])
    passages = split_page(page, max_tokens=100, count_tokens=approx_tokens)
    assert passages[0].text.startswith("Parent\n\nLong\n\nword0") and passages[0].url == "p.html#parent"
    assert all(approx_tokens(p.text) <= 100 for p in passages) and len(passages) >= 2


def test_split_cuts_one_overlong_block_by_sentences():
    sentences = " ".join(f"Sentence number {i} has some words in it." for i in range(40))
    page = Page("p.html", "P", [Section("", "", sentences)])
    passages = split_page(page, max_tokens=50, count_tokens=approx_tokens)
    assert len(passages) > 1 and all(approx_tokens(p.text) <= 50 for p in passages)
    assert " ".join(p.text for p in passages) == sentences


def test_build_index_over_tiny_corpus_then_rebuild_does_nothing(tiny_corpus, tmp_path, capsys):
    out = tmp_path / "index"
    parser = argparse.ArgumentParser()
    add_index_build_args(parser)
    args = parser.parse_args(["--source", str(tiny_corpus), "--out", str(out), "--quiet", "--threads", "1"])
    assert run_index_build(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["passages"] == 5 and manifest["pages"] == 5 and manifest["dim"] == 384
    store = PassageStore(out / STORE)
    assert {p.url for p in store.all()} == set(PAGES)
    assert store.get([0])[0].title in {title for title, _, _ in PAGES.values()}
    store.close()
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    again = build_index(tiny_corpus, out, progress=False, say=lambda _: None)
    assert not again.built
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps

    (tiny_corpus / "lists.html").write_text("<html><head><title>Lists</title></head><body><p>Changed.</p></body>")
    changed = build_index(tiny_corpus, out, progress=False, threads=1, say=lambda _: None)
    assert changed.built and changed.manifest["fingerprint"] != manifest["fingerprint"]
    assert not (out / ".partial").exists()


def test_build_index_rejects_an_empty_source(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_index_build_args(parser)
    assert run_index_build(parser.parse_args(["--source", str(tmp_path), "--out", str(tmp_path / "i")])) == 1
    assert "no HTML pages" in capsys.readouterr().err
