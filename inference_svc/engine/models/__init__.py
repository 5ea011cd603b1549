"""Model implementations: the Llama family (Llama, Mistral, Qwen2, SmolLM) shares one file."""

from inference_svc.engine.models.llama import (
    SUPPORTED_MODEL_TYPES,
    LlamaForCausalLM,
    ModelConfig,
    load_config,
    load_model,
    random_llama_config,
    random_model,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "LlamaForCausalLM",
    "ModelConfig",
    "load_config",
    "load_model",
    "random_llama_config",
    "random_model",
]
