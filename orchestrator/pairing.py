"""Prefill/decode pairing for disaggregated serving: FlowGuard lanes over the router's replicas.

Each replica reports its role in `GetStats` (`EngineStats.role`: "both", "prefill" or "decode";
empty from an older replica means "both"). When any reachable replica has a role other than
"both", a streamed Ask runs on a pair:

- the prefill lane is the replicas whose role is "prefill" or "both"; the prefill side is the one
  the router scores best among them (`ReplicaRouter.choose`: prefix locality, memory, queue, load);
- the decode lane is the replicas whose role is "decode" or "both", less the prefill side; the
  decode side is the router's best among them without a prefix key, so by memory, queue and load.

No reachable replica in the prefill lane: the request runs colocated where the router says. No
decode side: colocated on the prefill side. The prefill side is asked to hand off with the
`DECODE_TARGET_KEY` metadata; if the decode side fails, that replica decodes itself
(inference_svc/disagg), so a pair never answers worse than one replica.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from orchestrator.router import NoReplicaAvailable, Replica, ReplicaRouter
from protos.metadata import DECODE_TARGET_KEY

log = logging.getLogger(__name__)

PREFILL_ROLES = frozenset({"prefill", "both"})
DECODE_ROLES = frozenset({"decode", "both"})


@dataclass(frozen=True)
class Pair:
    prefill: Replica
    decode: Replica | None = None        # None: colocated on `prefill`

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the StreamPrompt call to the prefill side carries."""
        return ((DECODE_TARGET_KEY, self.decode.address),) if self.decode is not None else ()

    def __str__(self) -> str:
        return f"{self.prefill.address} -> {self.decode.address}" if self.decode else self.prefill.address


def role_of(replica: Replica) -> str:
    return (replica.stats.role if replica.stats is not None else "") or "both"


def choose_pair(router: ReplicaRouter, prefix_key: str, first: Replica) -> Pair:
    """The pair for a request the router already placed on `first` (its best replica overall)."""
    reachable = [r for r in router.replicas if r.available]
    if all(role_of(r) == "both" for r in reachable):
        return Pair(first)
    everyone = {r.address for r in router.replicas}
    prefill = first
    if role_of(first) not in PREFILL_ROLES:
        lane = {r.address for r in reachable if role_of(r) in PREFILL_ROLES}
        try:
            prefill = router.choose(prefix_key, exclude=everyone - lane)
        except NoReplicaAvailable:
            return Pair(first)                   # nothing prefills: colocated where the router said
    lane = {r.address for r in reachable if role_of(r) in DECODE_ROLES} - {prefill.address}
    try:
        decode = router.choose("", exclude=everyone - lane)
    except NoReplicaAvailable:
        log.info("pair: no decode replica available; colocated on %s", prefill.address)
        return Pair(prefill)
    return Pair(prefill, decode)
