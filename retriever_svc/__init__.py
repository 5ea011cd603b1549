"""The Retriever gRPC service and its kinds, in rooms: `corpus/` (documents at rest, embedding, the
site; the floor), `crawler/`, `anns/` (DiskANN over the collections), `collections/` (a user's live
collections), `milvus/` (the other engine of both) and `replay/` (a trace's chunks with their timing).

Here: `server` (flags → backend → serve) and `server_args`, `service` (the servicer every kind
shares and `RetrieverBackend`), and what several kinds share: `stages` (staged search and exact
top-k, the rule every ANNS index follows) and `stability` (the update hints).
"""
