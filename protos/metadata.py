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

# Call metadata naming the tenant a request is for (servicekit/tenants.py), and that tenant's
# fair-share weight and the request's priority (an integer, lower runs sooner, as vLLM's). The
# gateway names the tenant to the orchestrator (which honours it only from the stack's own key);
# the orchestrator sends all three to the replica on every call it makes for the request, and the
# replica's scheduler shares its steps between tenants by weight (engine/fair_share.py).
TENANT_KEY = "streamrag-tenant"
TENANT_WEIGHT_KEY = "streamrag-tenant-weight"
PRIORITY_KEY = "streamrag-priority"


def identity_metadata(tenant: str, weight: float = 1.0, priority: int = 0) -> tuple[tuple[str, str], ...]:
    """The metadata naming `tenant` (with its weight; none for the anonymous tenant "") and a priority
    (when not 0)."""
    out: list[tuple[str, str]] = []
    if tenant:
        out += [(TENANT_KEY, tenant), (TENANT_WEIGHT_KEY, f"{weight:g}")]
    if priority:
        out.append((PRIORITY_KEY, str(priority)))
    return tuple(out)

# Trailing metadata of a call refused for a tenant's limit (RESOURCE_EXHAUSTED) or for waiting too
# long to start (UNAVAILABLE): seconds to wait before retrying, and OpenAI's rate-limit headers
# (`x-ratelimit-*`), which the gateway copies onto its 429/503 answer. An admitted call of a tenant with
# a per-minute limit carries the `x-ratelimit-*` values at its admission in its initial metadata, which
# the gateway copies onto its answer's headers (streamed or not).
RETRY_AFTER_KEY = "retry-after"
RATE_LIMIT_PREFIX = "x-ratelimit-"
