"""The KV transfer between inference replicas that both backends speak (`KvTransfer`,
protos/kv_transfer.proto; docs/disagg.md): its wire conversions, the prefill side's call, the
decode side's checks and responses, and the servicer mixin that reads a call's decode target.
The native hand-off (`inference_svc/disagg/`) and the vLLM one (`inference_svc/vllm_backend/`)
build on it; it imports neither."""
