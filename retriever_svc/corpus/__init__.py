"""Corpus tools: documents at rest, and the pieces every room reads them with.

HTML pages -> sections -> passages -> SQLite store + vectors + DiskANN index:
`extract` turns one HTML page into a title and text sections, `loaders` reads a user's
files (md, rst, txt, html, pdf), `passages` packs sections into passages of a few hundred
tokens, `store` keeps passages in SQLite beside the index, `collection_store` keeps a
collection's files, passages and vectors in one SQLite file (a live collection's truth, and an
index build's checkpoint), `embedding` turns texts into
vectors (`EMBEDDING_DIM`, the one embedding dimension), and `index` builds the whole thing
(`streamrag index build`), resuming from `checkpoint`.

The site the crawler fetches: `web_server` (`streamrag serve corpus`) serves the HTML tree on
loopback with its own search (`site_search`); `relevance` is the one tokenizer and lexical
scorer the site search and the crawler share.
"""
