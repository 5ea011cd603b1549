"""gRPC call metadata keys that are part of the contract, next to the .proto files they go with.

A metadata key is wire format like a message field: every side imports it from here, so the
orchestrator and the inference service cannot drift apart on it.
"""

from __future__ import annotations

# StreamPrompt metadata naming the decode replica ("host:port") that a prefill replica hands the
# request's KV to (docs/disagg.md). Sent by the orchestrator's pairing, read by the inference service.
DECODE_TARGET_KEY = "streamrag-decode-target"

# Plain-call metadata naming the question the lifecycle store records (UTF-8; a `-bin` key, so any
# text travels). Sent by the gateway with a plain chat or completion, read by the orchestrator's
# Inference proxy; without it the prompt's text is recorded.
QUESTION_KEY = "streamrag-question-bin"

# A plain call re-issued after its orchestrator died: "<attempt>:<tokens>", the re-issue (1 for the first)
# and how many tokens the caller already has. The request is their continuation: the prompt, then those
# token ids as its last segment, `max_tokens` less them (servicekit/continuation.py). Sent by the gateway
# (gateway/plain_resume.py), read by the orchestrator's Inference proxy, which records it RESUMED.
RESUME_KEY = "streamrag-resume"

# A re-issued session `Ingest` (the orchestrator died under the first): the data version the caller
# had before the call, as decimal text. The orchestrator skips the batches already past it (they
# landed before the break) and ingests the rest (servicekit/session_reissue.py).
INGEST_AFTER_KEY = "streamrag-ingest-after"
