"""The `Inference` contract on vLLM's AsyncLLM (V1): `streamrag serve inference --backend vllm`.

The RPCs are the shared ones (`rpc.servicer.StreamServicerBase`); `servicer.VllmServicer`
implements their backend hook, with each request driven by `session.VllmRequest`, and
`service.VllmInferenceService` builds and starts it as one unit. Our policies run in vLLM's
scheduler through `scheduler.py` and `ranking.py`; `pressure.py` evicts idle streams; `config.py`
maps a `VllmSpec` onto vLLM's engine arguments.

The modules that import vllm (engine, session, scheduler and those above them: stats, servicer,
service) load only when `--backend vllm` is chosen: `inference_svc.server` imports them on that
path alone, so the native path never loads vllm. See docs/vllm.md for what maps exactly onto
vLLM and what does not.
"""
