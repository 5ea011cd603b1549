"""Our vLLM KV connector: ships a streamed prompt's KV out of a prefill replica as each forward pass
computes it, and loads shipped KV into a decode replica's blocks. The transfer itself (gRPC,
`protos/kv_transfer.proto`) is the service's job (`vllm_backend/handoff.py`, `kv_receiver.py`); this
class only moves KV between vLLM's paged cache and the spool (`kv_spool.py`).

vLLM loads it from outside its tree (`kv_transfer_config.kv_connector_module_path`, `config.py`),
twice in the engine-core process: a scheduler-side instance and a worker-side one, which talk
through the metadata vLLM builds each step (`build_connector_meta` -> `bind_connector_metadata`).
Which requests it touches is said per request in `SamplingParams.extra_args["kv_transfer_params"]`:

- `SHIP_KEY` {"dir", "from"} (prefill side): after every step that scheduled the request, the worker
  writes the KV of its prompt tokens from the last shipment (from "from", block-aligned, at first) to
  what the step computed. That covers tokens served by the prefix cache too: they are in the
  request's blocks. A streaming-input session keeps one vLLM request across its turns, so every turn's
  chunk is shipped when its forward pass ends, while the next chunk is still on its way.
- `LOAD_KEY` {"key"} (decode side): when vLLM first schedules the request, the prompt's longest prefix
  present in the spool file, less the last prompt token (vLLM computes at least one), is reported as
  externally computed (`get_num_new_matched_tokens`, synchronous); the worker copies it into the
  blocks vLLM allocated (`start_load_kv`, before the forward pass that computes the rest).

vLLM's CPU attention keeps one tensor per layer, ``[num_blocks, num_kv_heads, block_size, 2 * head_dim]``;
per block and head the first half is K, the second V (`cpu_attn.py`: "Make a view [num_blocks,
num_kv_heads, block_size * 2, head_size]. Then slice KV at dim 2"). Inside those halves the layout is
the kernel's: for the `vec` kernel (fp32, and bf16 without AMX) K is stored column-major
``[head_dim, block_size]`` and V row-major ``[block_size, head_dim]`` (vLLM's
`csrc/cpu/cpu_attn_vec.hpp`, `reshape_and_cache`: "reshape K as column-major and V as row-major").
`_read_blocks` and `_write_tokens` convert between that and the wire layout; another kernel's layout
(`amx`, `vec16`, ...) is refused when the worker registers its cache, naming it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from inference_svc.vllm_backend.kv_spool import LOAD_KEY, SHIP_KEY, SPOOL_CONFIG_KEY, KvSpool, Shipment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveSpec:
    """Worker: write the KV of tokens [start, start + len(token_ids)) from `block_ids` to the spool."""

    dir: str
    seq: int
    start: int
    token_ids: list[int]
    block_ids: list[int]


@dataclass(frozen=True)
class LoadSpec:
    """Worker: copy the spool file's KV of tokens [start, end) into `block_ids` (the request's blocks
    from token `start`, which is block-aligned)."""

    key: str
    start: int
    end: int
    block_ids: list[int]


@dataclass
class StreamragConnectorMetadata(KVConnectorMetadata):
    saves: list[SaveSpec] = field(default_factory=list)
    loads: list[LoadSpec] = field(default_factory=list)


@dataclass
class _Shipping:
    request: Any          # vLLM's Request (scheduler side)
    dir: str
    shipped: int          # prompt tokens whose KV was written
    seq: int = 0


class StreamragKvConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        model = vllm_config.model_config
        self.num_kv_heads = model.get_num_kv_heads(vllm_config.parallel_config)
        self.head_dim = model.get_head_size()
        self.spool = KvSpool(self._kv_transfer_config.get_from_extra_config(SPOOL_CONFIG_KEY, None))
        # scheduler side
        self._shipping: dict[str, _Shipping] = {}
        self._matched: dict[str, tuple[str, int]] = {}     # request id -> (spool key, first token loaded)
        self._loads: list[LoadSpec] = []
        # worker side: the paged cache, one tensor per layer in model order
        self._layers: list[torch.Tensor] = []

    # --- scheduler side ------------------------------------------------------------------
    def on_new_request(self, request) -> None:
        ship = (request.kv_transfer_params or {}).get(SHIP_KEY)
        if ship:
            start = int(ship.get("from", 0))
            self._shipping[request.request_id] = _Shipping(request, str(ship["dir"]),
                                                           start - start % self.block_size)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        load = (request.kv_transfer_params or {}).get(LOAD_KEY)
        if not load:
            return 0, False
        found = self.spool.read_load(str(load["key"]))
        if found is None:
            return 0, False
        token_ids, _ = found
        prompt = list(request.prompt_token_ids or ())
        matched = 0
        for have, want in zip(token_ids, prompt, strict=False):
            if have != want:
                break
            matched += 1
        count = min(matched, len(prompt) - 1) - num_computed_tokens
        if count <= 0:
            return 0, False
        self._matched[request.request_id] = (str(load["key"]), num_computed_tokens)
        return count, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        matched = self._matched.pop(request.request_id, None)
        if matched is None or num_external_tokens <= 0:
            return
        key, start = matched
        end = start + num_external_tokens
        block_ids = blocks.get_block_ids()[0]
        bs = self.block_size
        self._loads.append(LoadSpec(key, start, end, list(block_ids[start // bs:-(-end // bs)])))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = StreamragConnectorMetadata(loads=self._loads)
        self._loads = []
        block_state = scheduler_output.kv_connector_block_state
        bs = self.block_size
        for request_id, scheduled in scheduler_output.num_scheduled_tokens.items():
            shipping = self._shipping.get(request_id)
            if shipping is None:
                continue
            request = shipping.request
            end = min(request.num_computed_tokens + scheduled, request.num_prompt_tokens)
            if end <= shipping.shipped:
                continue
            block_ids = block_state.get_block_ids(request_id) if block_state is not None else None
            if block_ids is None:
                continue
            start = shipping.shipped - shipping.shipped % bs
            meta.saves.append(SaveSpec(shipping.dir, shipping.seq, start, list(request.all_token_ids[start:end]),
                                       list(block_ids[0][start // bs:-(-end // bs)])))
            shipping.shipped = end
            shipping.seq += 1
        return meta

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        self._shipping.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        return False, None

    # --- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        self._layers = [kv_caches[name] for name in sorted(kv_caches, key=_layer_index)]
        model = self._vllm_config.model_config
        isa = _get_attn_isa(model.dtype, self.block_size, self.head_dim)
        if isa != "vec":
            raise NotImplementedError(f"the streamrag KV connector knows the block layout of vLLM's CPU attention "
                                      f"kernel 'vec', not {isa!r} ({model.dtype}, block size {self.block_size})")
        per_block = self.num_kv_heads * 2 * self.block_size * self.head_dim
        for layer in self._layers:
            if layer[0].numel() != per_block:
                raise NotImplementedError(f"unexpected KV cache block shape {tuple(layer.shape[1:])}")

    def _halves(self, layer: torch.Tensor) -> torch.Tensor:
        """[num_blocks, num_kv_heads, 2 (K, V), block_size * head_dim]."""
        return layer.view(layer.shape[0], self.num_kv_heads, 2, self.block_size * self.head_dim)

    def _read_blocks(self, layer: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Blocks `index` of one layer in the wire layout [2, blocks, block_size, heads, head_dim]."""
        halves = self._halves(layer).index_select(0, index)
        n, heads, bs, dim = len(index), self.num_kv_heads, self.block_size, self.head_dim
        keys = halves[:, :, 0].reshape(n, heads, dim, bs).permute(0, 3, 1, 2)       # K is [head_dim, block_size]
        values = halves[:, :, 1].reshape(n, heads, bs, dim).permute(0, 2, 1, 3)
        return torch.stack([keys, values])

    def _write_tokens(self, layer: torch.Tensor, block_id: int, kv: torch.Tensor) -> None:
        """The first kv.shape[1] token slots of one block from wire-layout [2, tokens, heads, head_dim]."""
        block = self._halves(layer)[block_id]
        count, heads, bs, dim = kv.shape[1], self.num_kv_heads, self.block_size, self.head_dim
        block[:, 0].view(heads, dim, bs)[:, :, :count] = kv[0].permute(1, 2, 0)
        block[:, 1].view(heads, bs, dim)[:, :count] = kv[1].permute(1, 0, 2)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        bs = self.block_size
        for load in meta.loads:
            found = self.spool.read_load(load.key)
            if found is None:       # cannot happen while the service holds the call open
                raise RuntimeError(f"KV of {load.key!r} vanished from the spool before it was loaded")
            _, kv = found           # [layers, 2, blocks, block_size, heads, head_dim]
            first = load.start // bs
            for i, block_id in enumerate(load.block_ids):
                count = min(bs, load.end - (first + i) * bs)
                for layer, data in zip(self._layers, kv[:, :, first + i, :count], strict=True):
                    self._write_tokens(layer, block_id, data)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return      # everything is written in wait_for_save, once the whole forward pass is done

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        for save in meta.saves:
            index = torch.tensor(save.block_ids, dtype=torch.long)
            kv = torch.stack([self._read_blocks(layer, index) for layer in self._layers])
            self.spool.write_shipment(save.dir, save.seq, Shipment(save.start, save.token_ids, kv.contiguous()))


def _layer_index(name: str) -> int:
    numbers = re.findall(r"\.(\d+)\.", name)
    return int(numbers[-1]) if numbers else 0
