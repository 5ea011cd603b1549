"""The ANNS retriever: DiskANN search with early results (AquaPipe-style growing L).

- `stages`: staged search and exact top-k, the rule every ANNS index follows (the bundled
  one here, live collections, Milvus);
- `index`: the bundled index (`streamrag index build`'s directory) opened for search;
- `backend`: the `RetrieverBackend` over the collections (`--kind anns`), its options and
  `build_backend`.

Nothing is imported here: `retriever_svc.server` loads `anns.backend` by name, and
`collections` imports `anns.stages` without pulling in the backend that serves it.
"""
