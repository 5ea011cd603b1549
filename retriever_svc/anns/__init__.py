"""The ANNS retriever: DiskANN search with early results (AquaPipe-style growing L).

- `index`: the bundled index (`streamrag index build`'s directory) opened for search;
- `backend`: the `RetrieverBackend` over the collections (`--kind anns`), its options and
  `build_backend`.

Every index searches stage by stage with `retriever_svc.stages` (shared with the live collections
and Milvus). Nothing is imported here: `retriever_svc.server` loads `anns.backend` by name.
"""
