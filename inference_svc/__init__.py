"""The Inference gRPC service and its engine, in rooms:

- `engine/`: the native engine (scheduler, policies, KV pools, cost model, model runner); it knows
  nothing of gRPC or of the service, and imports nothing outside itself;
- `rpc/`: what both backends share: the one `Inference` servicer (`StreamServicerBase`, written
  once over a small backend hook), message conversion, the error→status map, metrics, the chat
  format, and the `RequestSummary` a backend ends a request with;
- `native/`: the service on the native engine (engine thread, its servicer hook, sessions, the
  service object that starts it all);
- `vllm_backend/`: the same contract on vLLM's AsyncLLM;
- `kv_transfer/`: the KV hand-off between replicas (`KvTransfer`), written once for both backends:
  the prefill side's state machine and call, the wire layout, the receiving call;
- `disagg/`: disaggregated prefill and decode on the native engine: a prefill replica ships a
  streamed prompt's KV chunk by chunk to a decode replica, which decodes (docs/disagg.md);
- here: starting a service (`server`: flags → spec → backend's service → serve; `server_args`, its
  flags; `options`, the service's defaults), running one as a subprocess (`launch`), the embedded
  model (`embedded_model`) and the cost model's profile (`profiling`, `streamrag profile`).

Imports go down only: server → disagg → native, vllm_backend → kv_transfer → rpc → engine
(tests/test_layering.py holds the table).
"""
