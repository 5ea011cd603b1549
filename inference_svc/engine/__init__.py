"""The native inference engine: scheduler, KV pools, model runner, sampler."""
