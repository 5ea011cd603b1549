"""The Orchestrator service: the Ask (relay and keeper), the plain-generation and Sessions proxies, the
replica router, and the Redis lifecycle store with the one module that writes it (`recording.py`)."""
