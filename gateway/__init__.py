"""The HTTP front of streamrag: an OpenAI-compatible API and streaming input over WebSocket.

Like the orchestrator, it talks to the other services only through the `protos` stubs: RAG
requests become `Orchestrator.Ask`, plain chats `Inference.Generate` on a replica it picks,
WebSocket input one `Inference.StreamPrompt`. See docs/gateway.md.
"""
