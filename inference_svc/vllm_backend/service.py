"""The vLLM-backed Inference service: AsyncLLM + servicer + gRPC server, started and stopped as one."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import torch

from inference_svc.engine.factory import load_tokenizer
from inference_svc.engine.kv_export import KvLayout
from inference_svc.engine.policies import make_policy
from inference_svc.engine.tokenization import SegmentTokenizer
from inference_svc.options import DEFAULT_MAX_STREAMS, DEFAULT_ROLE
from inference_svc.rpc.chat_format import chat_format
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.servicer import SERVICE_NAME
from inference_svc.vllm_backend.config import VLLM_RESERVED_BLOCKS, VllmSpec
from inference_svc.vllm_backend.engine import start_engine
from inference_svc.vllm_backend.handoff import VllmDisaggServicer
from inference_svc.vllm_backend.kv_receiver import SERVICE_NAME as KV_TRANSFER_SERVICE_NAME
from inference_svc.vllm_backend.kv_receiver import VllmKvTransferServicer
from inference_svc.vllm_backend.kv_spool import KvSpool, default_spool_root, remove_stale_spools
from inference_svc.vllm_backend.pressure import IdleSessionEvictor
from inference_svc.vllm_backend.prompt import PromptLimits, StreamedPrompt
from inference_svc.vllm_backend.servicer import VllmServicer
from inference_svc.vllm_backend.stats import StatsSource
from protos import inference_pb2, inference_pb2_grpc, kv_transfer_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner

log = logging.getLogger(__name__)


def eos_token_ids(model_dir: Path, tokenizer) -> tuple[int, ...]:
    """End-of-sequence ids from config.json and generation_config.json (as the native runner reads them)."""
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        path = model_dir / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    if not ids and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(ids)


def kv_bytes_per_block(hf_config, block_size: int, dtype: str) -> int:
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return 2 * hf_config.num_hidden_layers * heads * head_dim * block_size * itemsize


class VllmInferenceService:
    """Same surface as `native.service.NativeInferenceService` (start/stop/runner)."""

    def __init__(self, spec: VllmSpec, config: ServiceConfig, max_streams: int = DEFAULT_MAX_STREAMS,
                 role: str = DEFAULT_ROLE) -> None:
        self.spec = spec
        self.role = role
        for stale in remove_stale_spools():      # left by a replica killed before its shutdown
            log.info("removed the stale KV spool %s (its owner process is gone)", stale)
        # A prefill or decode replica runs our KV connector (docs/vllm.md, "Disaggregated prefill and decode")
        self.spool = KvSpool(default_spool_root()) if role != DEFAULT_ROLE else None
        self.llm, counters = start_engine(spec, str(self.spool.root) if self.spool else None)
        tokenizer = load_tokenizer(spec.model_dir)
        segment_tokenizer = SegmentTokenizer(tokenizer)
        cache = self.llm.vllm_config.cache_config
        model_config = self.llm.model_config
        total_blocks, block_size = int(cache.num_gpu_blocks or 0), int(cache.block_size)
        limits = PromptLimits(model_config.get_vocab_size(), model_config.max_model_len,
                              (total_blocks - VLLM_RESERVED_BLOCKS) * block_size)   # what requests can hold
        self.metrics = InferenceMetrics()
        info = inference_pb2.ModelInfo(
            model=spec.model_dir.name, context_length=model_config.max_model_len, block_size=block_size,
            policy=spec.policy, backend="vllm", eviction_mode=spec.eviction, dtype=spec.dtype, device=spec.device,
            chat_format=chat_format(tokenizer, eos_token_ids(spec.model_dir, tokenizer)),
            vocab_size=model_config.get_vocab_size(),
            token_budget=self.llm.vllm_config.scheduler_config.max_num_batched_tokens)
        stats = StatsSource(counters, total_blocks, block_size,
                            kv_bytes_per_block(model_config.hf_config, block_size, spec.dtype),
                            info.model, spec.policy, info.token_budget)
        new_prompt = lambda: StreamedPrompt(segment_tokenizer, limits)   # noqa: E731
        common = (self.llm, new_prompt, segment_tokenizer.decode, stats)
        services = [SERVICE_NAME]
        self.kv_transfer = None
        if self.spool is None:
            self.servicer = VllmServicer(*common, info, self.metrics, max_streams)
        else:
            parallel = self.llm.vllm_config.parallel_config
            layout = KvLayout(model_config.get_num_layers(parallel), model_config.get_num_kv_heads(parallel),
                              model_config.get_head_size(), block_size, spec.dtype)
            self.kv_transfer = VllmKvTransferServicer(*common, layout, total_blocks - VLLM_RESERVED_BLOCKS, self.spool)
            self.servicer = VllmDisaggServicer(*common, info, self.metrics, max_streams, role=role, layout=layout,
                                               spool=self.spool, receiver=self.kv_transfer)
            services.append(KV_TRANSFER_SERVICE_NAME)
        servicers = [(inference_pb2_grpc.add_InferenceServicer_to_server, self.servicer)]
        if self.kv_transfer is not None:
            servicers.append((kv_transfer_pb2_grpc.add_KvTransferServicer_to_server, self.kv_transfer))
        self.runner = ServiceRunner(config, servicers, services, registry=self.metrics.registry)
        self._evictor: asyncio.Task | None = None

    async def start(self, handle_signals: bool = True) -> int:
        port = await self.runner.start(handle_signals=handle_signals)
        if self.spec.policy != "default":   # vLLM-S stays vLLM as it is (pressure.py)
            stats = self.servicer.stats
            policy = make_policy(self.spec.policy, **dict(self.spec.policy_options))   # as the scheduler class's
            evictor = IdleSessionEvictor(stats.counters, self.servicer.open_requests, policy,
                                         stats.total_blocks, stats.block_size)
            self._evictor = asyncio.get_running_loop().create_task(evictor.run(), name="idle-session-evictor")
        return port

    async def stop(self, grace_s: float | None = None) -> None:
        if self._evictor is not None:
            self._evictor.cancel()
        await self.runner.stop(grace_s)
        if isinstance(self.servicer, VllmDisaggServicer):
            await self.servicer.close_channels()
        self.shutdown()

    def shutdown(self) -> None:
        self.llm.shutdown()
        if self.spool is not None:
            self.spool.remove()
