"""Where the vLLM KV connector and the service's gRPC side hand KV to each other: a directory.

vLLM runs its scheduler and model in the engine-core process; the `KvTransfer` calls run in the
service's process. Between the two, KV goes through files under one spool directory per replica
(`/dev/shm` when it exists, so memory to memory):

- ``ship/<dir>/<seq>.kv`` (prefill side): written by the connector after each forward pass, one file
  per request and step: the KV of the prompt tokens ``[start, start + len(token_ids))`` as whole
  blocks (the last one may be partly filled), read and deleted by the service, which sends each as a
  `blocks` message. One ``<dir>`` per vLLM submission ("incarnation") of a request.
- ``load/<key>.kv`` (decode side): written by the service when `finish` arrives, the KV of the
  prompt received so far; the connector reports its tokens to vLLM as already computed and copies
  them into the blocks vLLM allocated for the request. Deleted by the service when the call ends.

Each spool directory (``streamrag-kv-*``) holds an ``owner`` file: the pid and /proc start time
of the service that made it. A service removes its directory at shutdown; one killed with SIGKILL
cannot, so every vLLM replica removes, at start-up, the directories whose owner process is gone
(`remove_stale_spools`); a live replica's directory, or one whose owner is not written yet, stays.

Every file is written under a temporary name and renamed, so a reader never sees half a file. KV
tensors use the transfer's wire layout ``[num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim]`` (`engine.kv_export`), so what is read here goes on the wire as it is. No vllm import:
both processes use this module.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from servicekit.pids import is_alive, this_process

SHIP_KEY = "streamrag_ship"     # kv_transfer_params: {"dir": ..., "from": tokens the decode side holds}
LOAD_KEY = "streamrag_load"     # kv_transfer_params: {"key": ...}
SPOOL_CONFIG_KEY = "streamrag_spool"     # kv_connector_extra_config: the spool directory


@dataclass(frozen=True)
class Shipment:
    """The KV of tokens [start, start + len(token_ids)), start block-aligned."""

    start: int
    token_ids: list[int]
    data: torch.Tensor      # [layers, 2, blocks, block_size, kv_heads, head_dim] (the wire layout)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


SPOOL_PREFIX = "streamrag-kv-"
OWNER_FILE = "owner"            # "<pid> <start ticks>" of the service that made the directory


def spool_base() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def default_spool_root(base: Path | None = None) -> Path:
    """A new spool directory under `base` (default `spool_base()`), owned by this process."""
    root = Path(tempfile.mkdtemp(prefix=SPOOL_PREFIX, dir=base or spool_base()))
    pid, started = this_process()
    (root / OWNER_FILE).write_text(f"{pid} {started}\n")
    return root


def spool_owner(root: Path) -> tuple[int, int] | None:
    """The (pid, start ticks) recorded in a spool directory; None when none is readable."""
    try:
        pid, started = (root / OWNER_FILE).read_text().split()
        return int(pid), int(started)
    except (OSError, ValueError):
        return None


def remove_stale_spools(base: Path | None = None) -> list[Path]:
    """Remove the spool directories under `base` whose owner process is gone; returns them. A directory
    without a readable owner (being made right now, or made before owners were recorded) is kept."""
    removed = []
    for root in sorted((base or spool_base()).glob(f"{SPOOL_PREFIX}*")):
        owner = spool_owner(root) if root.is_dir() and not root.is_symlink() else None
        if owner is not None and not is_alive(*owner):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
    return removed


class KvSpool:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._names = itertools.count()

    # --- prefill side ------------------------------------------------------------------
    def new_ship_dir(self) -> str:
        """A fresh directory for one submission's shipments (made before vLLM sees the request)."""
        name = f"{os.getpid()}-{next(self._names)}"
        (self.root / "ship" / name).mkdir(parents=True)
        return name

    def write_shipment(self, name: str, seq: int, shipment: Shipment) -> bool:
        """Connector side; False when the directory is gone (the submission was abandoned)."""
        folder = self.root / "ship" / name
        if not folder.is_dir():
            return False
        payload = {"start": shipment.start, "token_ids": list(shipment.token_ids), "kv": shipment.data}
        return _write(folder / f"{seq:09d}.kv", payload)

    def take_shipments(self, name: str) -> list[Shipment]:
        """The shipments written so far, in order; their files are deleted."""
        folder = self.root / "ship" / name
        if not folder.is_dir():
            return []
        shipments = []
        for path in sorted(folder.glob("*.kv")):
            payload = torch.load(path, weights_only=True)
            shipments.append(Shipment(payload["start"], payload["token_ids"], payload["kv"]))
            path.unlink()
        return shipments

    def drop_ship_dir(self, name: str) -> None:
        shutil.rmtree(self.root / "ship" / name, ignore_errors=True)

    # --- decode side -------------------------------------------------------------------
    def write_load(self, key: str, token_ids: list[int], kv: torch.Tensor) -> None:
        (self.root / "load").mkdir(parents=True, exist_ok=True)
        if not _write(self.root / "load" / f"{key}.kv", {"token_ids": list(token_ids), "kv": kv}):
            raise OSError(f"cannot write the KV of {key!r} under {self.root}")

    def read_load(self, key: str) -> tuple[list[int], torch.Tensor] | None:
        """Connector side (memory-mapped: the scheduler reads only the tokens)."""
        path = self.root / "load" / f"{key}.kv"
        try:
            payload = torch.load(path, weights_only=True, mmap=True)
        except (FileNotFoundError, RuntimeError):
            return None
        return payload["token_ids"], payload["kv"]

    def drop_load(self, key: str) -> None:
        (self.root / "load" / f"{key}.kv").unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _write(path: Path, payload: dict) -> bool:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except FileNotFoundError:       # the directory was removed meanwhile
        return False
    return True
