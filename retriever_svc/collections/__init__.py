"""A user's own documents, live: named collections that take files while the retriever serves.

`corpus.collection_store` (SQLite, the truth) ← `search_index` (the live-index base: write lock, one merge at a
time, exact search, the embedding dimension) ← `live` (diskannpy: disk index + in-memory part +
delete marks, merged in the background; `retriever_svc.milvus.live` is the other engine) ←
`collection` (files in and out) ← `registry` (names, the bundled default)
← `servicer` (the `Collections` gRPC service).
"""
