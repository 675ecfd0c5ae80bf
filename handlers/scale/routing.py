"""The request router of the engine replicas: Ray Serve's RequestRouter, with prefix affinity.

The ingress puts each request's affinity key (affinity.py) in the handle's `session_id`. A request
whose key was served before goes to the replica that served it, while that replica is alive, not full
(Serve's max_ongoing_requests) and not far busier than the least-loaded one; everything else goes to
the least-loaded replica by the queue lengths Serve probes and caches. Which replica served a key is
kept in a bounded LRU map, updated once a replica has accepted the request.

Serve ships this class to the process that holds the handle (the ingress) by value, so it imports
nothing of swama.
"""

from __future__ import annotations

import random
from collections import OrderedDict

try:
    from ray.serve.request_router import (
        PendingRequest,
        ReplicaID,
        ReplicaResult,
        RequestRouter,
        RunningReplica,
    )
except ImportError:  # Ray Serve comes with the `scale` extra; without it this module imports, unused
    RequestRouter = object  # type: ignore[assignment,misc]


def _key(pending_request: PendingRequest | None) -> str:
    return pending_request.metadata.session_id if pending_request is not None else ""


class AffinityRouter(RequestRouter):
    """Prefix affinity first, then the least-loaded replica. No FIFO mixin: each request is matched to
    the replica chosen for it, which affinity needs."""

    def initialize_state(self, max_keys: int = 65536, imbalance: int = 16) -> None:
        # Keys of conversations and inputs, most recently used last; the oldest go past `max_keys`.
        self._owners: OrderedDict[str, ReplicaID] = OrderedDict()
        self._max_keys = max_keys
        # How many more requests than the least-loaded replica the holder of a prefix may have before
        # the request goes elsewhere: a cached prefix saves one prefill, a long queue costs more.
        self._imbalance = imbalance

    def _queue_len(self, replica: RunningReplica) -> int | None:
        return self.replica_queue_len_cache.get(replica.replica_id)

    def _too_busy(self, owner: RunningReplica, others: list[RunningReplica]) -> bool:
        owner_len = self._queue_len(owner)
        lens = [n for n in map(self._queue_len, others) if n is not None]
        return owner_len is not None and bool(lens) and owner_len - min(lens) > self._imbalance

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        # Shuffled so that equally loaded replicas share the work instead of the first always winning.
        shuffled = random.sample(candidate_replicas, len(candidate_replicas))
        key = _key(pending_request)
        owner_id = self._owners.get(key) if key else None
        if owner_id is None:
            return [shuffled]
        owner = next((r for r in candidate_replicas if r.replica_id == owner_id), None)
        if owner is None:  # that replica is gone: its cache went with it
            del self._owners[key]
            return [shuffled]
        others = [r for r in shuffled if r.replica_id != owner_id]
        if self._too_busy(owner, others):
            return [shuffled]
        # Ranked: the holder of the prefix first; when it is full, the least loaded of the rest.
        return [[owner], others] if others else [[owner]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        key = _key(pending_request)
        if not key:
            return
        self._owners[key] = replica_id
        self._owners.move_to_end(key)
        while len(self._owners) > self._max_keys:
            self._owners.popitem(last=False)
