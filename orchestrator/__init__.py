"""The Ask pipeline, Redis lifecycle store, replica router, the `streamrag` CLI and the local stack."""
