"""Corpus tools: HTML pages -> sections -> passages -> SQLite store + DiskANN index.

`extract` turns one HTML page into a title and text sections, `passages` packs sections
into passages of a few hundred tokens, `store` keeps passages in SQLite beside the index,
and `index` builds the whole thing (`streamrag index build`).
"""
