"""The `Inference` contract on vLLM's AsyncLLM (V1): `streamrag serve inference --backend vllm`.

Nothing here imports vllm at module import time except `engine.py` and `service.py`, which the
server imports only when `--backend vllm` is chosen; the native path never loads vllm.
See docs/vllm.md for what maps exactly onto vLLM and what does not.
"""
