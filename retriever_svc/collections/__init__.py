"""A user's own documents, live: named collections that take files while the retriever serves.

`store` (SQLite, the truth) ← `live` (disk index + in-memory part + delete marks, merged in
the background) ← `collection` (files in and out) ← `registry` (names, the bundled default)
← `servicer` (the `Collections` gRPC service).
"""
