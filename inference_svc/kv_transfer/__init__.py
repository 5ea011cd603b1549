"""The KV hand-off between inference replicas, written once for both backends (`KvTransfer`,
protos/kv_transfer.proto; docs/disagg.md):
- `handoff`: the prefill side's state machine (what is shipped and when, the hand-off, the
  fall-back and the resume), a mixin over backend hooks;
- `transfer_call`: the prefill side's `Transfer` call (its messages, acks and relayed events);
- `receive_call`: the decode side's `KvTransferServicerBase` (the whole `Transfer()` over a backend
  hook, in the `rpc.servicer.StreamServicerBase` way), its checks and responses;
- `decode_targets`: the `Inference` servicer mixin that reads a call's decode target and hands it off;
- `wire`: the conversions to and from the wire.
The native hand-off (`inference_svc/disagg/`) and the vLLM one (`inference_svc/vllm_backend/`) keep
only how they export, import and decode blocks; this package imports neither."""
