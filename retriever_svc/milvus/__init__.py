"""The ANNS retriever on Milvus: the same `Retrieve` contract and `Collections` service, with the vectors in Milvus.

`connection` (URI, index type, timeouts, the one Milvus-error -> RetrieverUnavailable rule)
<- `index` (one Milvus collection: staged search by growing `search_list`/`ef`, insert, delete,
reconcile with a store) <- `live` (a live collection's index: the SQLite store stays the truth,
Milvus mirrors it) and `bundled` (the default index's vectors uploaded once) <- `backend`
(`streamrag serve retriever --kind anns --backend milvus`). `embedded` runs the `milvus`
package's server for tests, benches and `streamrag up --anns-backend milvus`.
"""
