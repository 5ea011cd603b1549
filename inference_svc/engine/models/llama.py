"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over packed tokens and a paged KV cache.

Weights come straight from Hugging Face safetensors (no transformers model is built): q/k/v
are fused into one linear and gate/up into another at load time. RoPE inverse frequencies
and their attention scaling come from transformers' own RoPE init functions, so every
scaling variant (linear, dynamic, llama3, yarn, ...) matches Hugging Face exactly.

The forward pass takes the tokens of several sequences concatenated (``[T]`` ids and
positions) and the step's ``BatchAttention`` (batch_attention.py), which every layer calls, and
returns hidden states ``[T, hidden]``; ``compute_logits`` applies the final norm and the LM head
only to the rows the caller asks for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from inference_svc.engine.batch_attention import BatchAttention

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")  # besides "default"


@dataclass(frozen=True)
class ModelConfig:
    """The shape facts the runner, the KV cache and the scheduler need."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    name: str = ""
    hf_config: Any = field(default=None, repr=False, compare=False)  # transformers config, for RoPE

    @classmethod
    def from_hf(cls, hf: Any, *, eos_token_ids: tuple[int, ...] = (), name: str = "") -> ModelConfig:
        model_type = getattr(hf, "model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
        if getattr(hf, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {hf.hidden_act!r} (only silu)")
        max_pos = hf.max_position_embeddings
        window = getattr(hf, "sliding_window", None)
        if window:  # full attention equals sliding-window attention up to the window
            max_pos = min(max_pos, window)
        attention_bias = bool(getattr(hf, "attention_bias", False))
        return cls(
            model_type=model_type,
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            num_heads=hf.num_attention_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
            intermediate_size=hf.intermediate_size,
            vocab_size=hf.vocab_size,
            max_position_embeddings=max_pos,
            rms_norm_eps=hf.rms_norm_eps,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias,
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            eos_token_ids=eos_token_ids,
            bos_token_id=getattr(hf, "bos_token_id", None),
            name=name,
            hf_config=hf,
        )


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read ``config.json`` (and ``generation_config.json`` for end-of-sequence ids)."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    hf = AutoConfig.from_pretrained(model_dir)
    eos = _as_ids(getattr(hf, "eos_token_id", None))
    gen_path = model_dir / "generation_config.json"
    if gen_path.exists():
        eos += _as_ids(json.loads(gen_path.read_text()).get("eos_token_id"))
    return ModelConfig.from_hf(hf, eos_token_ids=tuple(dict.fromkeys(eos)), name=model_dir.name)


# Shapes of public checkpoints, for benchmarks with random weights.
_RANDOM_SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009],
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "smollm2-135m": dict(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    ),
    # A few-layer shape for dry runs on a CPU (`bench gpu --device cpu --small`): Triton's interpreter is slow.
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        vocab_size=1024,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def random_llama_config(name: str = "llama-3.1-8b", **overrides: Any) -> ModelConfig:
    """The shape hyper-parameters of a known checkpoint (weights are drawn by ``random_model``)."""
    from transformers import LlamaConfig

    if name not in _RANDOM_SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {sorted(_RANDOM_SHAPES)}")
    hf = LlamaConfig(**{**_RANDOM_SHAPES[name], **overrides})
    return ModelConfig.from_hf(hf, eos_token_ids=tuple(_as_ids(hf.eos_token_id)), name=name)


def rope_parameters(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[head_dim/2]`` (fp32, CPU) and the cos/sin scaling factor.

    "dynamic" scaling only changes frequencies beyond ``max_position_embeddings``, which the
    runner refuses, so its frequencies at init are the ones Hugging Face uses too.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = config.hf_config
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        base = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
        dim = config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv_freq, 1.0
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, {', '.join(SUPPORTED_ROPE_TYPES)}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class RMSNorm(nn.Module):
    """Hugging Face's RMSNorm: normalise in fp32, cast back, then scale."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin for arbitrary positions, computed per step in fp32 like Hugging Face."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scaling = scaling

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
        cos, sin = emb.cos(), emb.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (Hugging Face's rounding), as a new contiguous tensor.

    ``x`` is ``[heads, T, head_dim]`` (any strides), ``cos``/``sin`` are ``[T, head_dim]``; the
    result is head-major and contiguous, the layout attention kernels read fastest.
    """
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1).mul_(sin)
    return torch.mul(x, cos, out=torch.empty_like(rotated)).add_(rotated)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.o_bias)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``q`` ``[heads, T, D]`` and ``k``, ``v`` ``[kv_heads, T, D]`` (rotated, each head's rows dense)."""
        h, hkv = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(x.shape[0], h + 2 * hkv, self.head_dim).transpose(0, 1)  # [heads, T, D]
        qk = apply_rotary(qkv[: h + hkv], cos, sin)
        return qk[:h], qk[h:], qkv[h + hkv :].contiguous()


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: BatchAttention,
                kv: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``(x, cos, sin)`` of the rows that went through the layer (``attention.narrow`` may drop rows)."""
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        keep = attention.narrow(self.self_attn.layer_idx, k, v, kv[0], kv[1])
        if keep is not None:   # blend: only these rows go on
            x, cos, sin, q, k, v = x[keep], cos[keep], sin[keep], q[:, keep], k[:, keep], v[:, keep]
        x = x + self.self_attn.o_proj(attention.attend(q, k, v, kv[0], kv[1]))
        return x + self.mlp(self.post_attention_layernorm(x)), cos, sin


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, rope: tuple[torch.Tensor, float] | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, False)
        self.rotary = RotaryEmbedding(*(rope or rope_parameters(config)))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: BatchAttention,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Hidden states (before the final norm) of the packed tokens ``[T]`` that went through every layer
        (all of them, unless a blend's ``narrow`` dropped some)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x, cos, sin = layer(x, cos, sin, attention, kv)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head over the given rows; float32 ``[n, vocab]``."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm(hidden), weight).float()


def _empty_model(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """Build on the meta device in ``dtype``, then allocate uninitialised storage on ``device``."""
    inv_freq, scaling = rope_parameters(config)  # on the CPU in fp32, outside the meta context
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(config, rope=(inv_freq, scaling))
    finally:
        torch.set_default_dtype(default_dtype)
    model = model.to_empty(device=device)
    model.rotary.inv_freq = inv_freq.to(device)  # to_empty left it uninitialised
    return model.eval().requires_grad_(False)


def _fuse(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)


def load_model(
    model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16
) -> LlamaForCausalLM:
    """Load a Hugging Face directory (``config.json`` + ``*.safetensors``) onto ``device``."""
    model_dir, device = Path(model_dir), torch.device(device)
    config = load_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    where = {name: h for h in handles for name in h.keys()}  # noqa: SIM118 - safe_open has no __iter__

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise KeyError(f"{model_dir}: missing weight {name}")
        return where[name].get_tensor(name)

    model = _empty_model(config, device, dtype)
    sources: dict[str, list[str]] = {}
    for name in model.state_dict():
        hf_name = name if name.startswith("lm_head") else "model." + name
        if ".qkv_proj." in name:
            sources[name] = [hf_name.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
        elif ".gate_up_proj." in name:
            sources[name] = [hf_name.replace("gate_up_proj", p) for p in ("gate_proj", "up_proj")]
        else:
            sources[name] = [hf_name]
    params = dict(model.named_parameters())
    for name, hf_names in sources.items():
        params[name].copy_(_fuse([get(n) for n in hf_names]))
    return model


def random_model(
    config: ModelConfig,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> LlamaForCausalLM:
    """Random weights drawn directly on ``device`` in ``dtype`` (speed does not depend on values)."""
    device = torch.device(device)
    model = _empty_model(config, device, dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "norm.weight":
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, 0.02, generator=gen)
    return model
