"""Disaggregated prefill and decode: a prefill replica ships a streamed prompt's KV, chunk by chunk,
to a decode replica (`KvTransfer`, protos/kv_transfer.proto), which decodes; docs/disagg.md."""
