"""retriever_svc package."""
