"""What both backends share: the `Inference` RPCs written once, and everything they speak in.

`servicer.StreamServicerBase` implements the RPCs over a backend hook (`native.servicer`,
`vllm_backend.servicer` implement it); `convert` turns messages into the engine's plain objects
(validating them); `errors` maps every error to its gRPC status, for the Sessions RPCs too;
`summary.RequestSummary` is how a backend ends a request; `metrics` the Prometheus metrics both
expose; `chat_format` the model's chat pieces for Describe. Nothing here knows which backend runs.
"""
