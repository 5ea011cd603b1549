"""The Inference service on the native engine (`streamrag serve inference`, the default backend).

`service.NativeInferenceService` builds and starts it as one unit: the engine, the thread that
runs it (`engine_thread`), the `Inference` servicer's backend hook (`servicer`), the Sessions
service (`sessions`: its logic over the engine's public calls; `sessions_servicer`: its RPCs,
which only this backend serves) and the metrics read off the engine after each step (`metrics`).
The RPCs themselves, the error map and the metric definitions are shared with vLLM, in `rpc/`.
"""
