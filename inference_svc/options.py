"""The inference service's own choice lists and defaults, written once.

What the engine takes (policies, dtypes, block size, token budget, speculation) is in
`inference_svc.engine.options`; what only the service has (which backend serves, how many calls
and sessions it holds open) is here. Torch-free, like the engine's, so the flags of
`streamrag serve inference` and `streamrag up` import it without loading the engine.
"""

from __future__ import annotations

BACKEND_CHOICES = ("native", "vllm")
DEFAULT_BACKEND = "native"
DEFAULT_MAX_STREAMS = 256           # open StreamPrompt/Generate calls per service
DEFAULT_MAX_SESSIONS = 16           # open sessions per inference service (the Sessions service)
ROLE_CHOICES = ("both", "prefill", "decode")   # disaggregated serving (docs/disagg.md): routing only
DEFAULT_ROLE = "both"               # prefill and decode on this replica (colocated)
