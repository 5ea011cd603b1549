"""The streamrag gRPC contracts (package `streamrag.v1`) and their generated stubs.

The .proto files here are the contract documentation; the *_pb2*.py files are
generated from them by `python -m protos.generate` and committed. Beside them, what is contract
but no message: `metadata` (call metadata keys) and `retrievers` (the retriever names users type and
their `RetrieverChoice`).
"""
