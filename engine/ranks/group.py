"""This process's place in a group of ranks that hold one model between them (MLX distributed).

Rank 0 serves HTTP and decides every scheduler step; before a step's forward passes it shares the
step's plan (`share`): one all-gather of a small status row from every rank (the plan's length, a
checksum of the tokens the rank sampled last step, its pid and memory), then one all-sum that
carries the plan's bytes from rank 0 (the others add zeros). The other ranks wait in the same two
collectives and then run the same step, woken for it by rank 0's doorbell (ranks/doorbell.py:
MLX's ring backend polls while it waits in a collective, so the ranks wait before it, asleep). An
idle rank 0 shares an empty plan every `HEARTBEAT` seconds, so every rank always knows the others
are alive.

No wait is unbounded (a collective can hang on a peer that stopped, not only fail): a watchdog
thread fails the group when a step on rank 0 takes longer than `timeout` seconds, or when a rank
hears nothing from rank 0 for that long. A failed group calls its failure handlers (rank 0 ends
the requests in flight with a 503) and the process exits with `EXIT_GROUP_FAILED`; whoever started
the group restarts it or gives up (handlers/scale/ranks.py). A collective that raises (the ring
backend raises when a peer's socket closes) fails the group the same way, at once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swama.engine.errors import Unavailable
from swama.engine.model import LoadedModel
from swama.engine.ranks.doorbell import Doorbell, DoorbellClosed, open_doorbell

log = logging.getLogger("swama.ranks")

STARTUP_TIMEOUT = 900.0  # seconds the ranks may take to connect, and to load their shards before the first step
HEARTBEAT = 1.0  # seconds between the empty plans an idle rank 0 shares
EXIT_GROUP_FAILED = 75  # the exit status of a rank whose group failed (EX_TEMPFAIL: start it again)
FAILURE_LINE = "swama: rank group failed: "  # the line a failing rank writes, for whoever started it
SERVING_LINE = "swama: rank 0 serves HTTP"  # what rank 0 writes once its server has started, after READY_LINE
READY_LINE = "swama: every rank is ready"  # the line rank 0 writes once the whole group ran its first step
GRACE = 2.0  # seconds rank 0 leaves the event loop to send the 503s before it exits
DOORBELL_TIMEOUT = 30.0  # seconds the ranks may take to connect their doorbells, once joined
STATUS_FIELDS = ("length", "checksum", "pid", "active_mib", "turns")


class GroupFailed(Unavailable):
    """The group can no longer run a step: a rank died, stopped answering or diverged."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="rank_failed")


@dataclass
class RankStatus:
    rank: int
    address: str  # where its ring connections listen (the host file's entry), else ""
    pid: int = 0
    active_mib: int = 0
    turns: int = 0


def addresses(size: int) -> list[str]:
    """Each rank's address from the host file mlx.launch (or our own launcher) hands the ring backend."""
    path = os.environ.get("MLX_HOSTFILE")
    try:
        entries = json.loads(open(path).read()) if path else []
    except (OSError, ValueError):
        entries = []
    found = [",".join(e) if isinstance(e, list) else str(e) for e in entries]
    return (found + [os.environ.get("NCCL_HOST_IP", "")] * size)[:size]


class RankGroup:
    def __init__(self, group: Any, backend: str, timeout: float, startup_timeout: float, *, restarts: int = 0,
                 last_failure: str | None = None) -> None:
        self.group = group
        self.backend = backend
        self.rank = int(group.rank())
        self.size = int(group.size())
        self.timeout = timeout
        self.model_id: str | None = None  # the model the ranks split (set by the process that joined)
        self.split: str | None = None  # "tensor" or "pipeline", once loaded
        self.restarts = restarts  # times the group was started again after a failure
        self.last_failure = last_failure
        self.peers = [RankStatus(r, a) for r, a in enumerate(addresses(self.size))]
        self.turns = 0
        self.failed: str | None = None
        self.ready = threading.Event()  # every rank loaded its shard and took part in a step
        self.doorbell: Doorbell | None = None  # rank 0 rings it before each plan (ranks/doorbell.py)
        self._bound = startup_timeout  # the first step waits for every rank's load
        self._busy_since: float | None = None
        self._last_turn = time.monotonic()
        self._on_failure: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._watch = threading.Thread(target=self._watchdog, name="swama-rank-watchdog", daemon=True)
        self._watch.start()

    # -- the plan of each step -------------------------------------------------------------------

    def share(self, payload: bytes, checksum: int) -> bytes:
        """Rank 0's plan to every rank (the others pass b""), with each rank's status gathered on
        the way. Raises GroupFailed when a collective fails or a rank's last tokens differ."""
        import mlx.core as mx
        import numpy as np

        if self.failed is not None:
            raise GroupFailed(self.failed)
        if self.doorbell is not None:
            try:
                if self.rank == 0:
                    self.doorbell.ring()
                else:  # asleep until rank 0 shares, not polling in the collective
                    self.doorbell.wait(self._bound + HEARTBEAT)
            except DoorbellClosed as exc:
                raise GroupFailed(str(exc)) from exc
        stream = mx.gpu if self.backend == "nccl" else mx.cpu
        self._busy_since = time.monotonic()
        try:
            row = [len(payload), checksum & 0x7FFFFFFF, os.getpid(), int(mx.get_active_memory()) >> 20, self.turns]
            status = mx.distributed.all_gather(mx.array([row], dtype=mx.int32), group=self.group, stream=stream)
            table = np.array(status).tolist()
            length = table[0][0]
            if length:
                mine = np.frombuffer(payload, dtype=np.uint8) if self.rank == 0 else np.zeros(length, np.uint8)
                payload = bytes(np.array(mx.distributed.all_sum(mx.array(mine), group=self.group, stream=stream)))
        except Exception as exc:
            raise GroupFailed(f"a collective failed on rank {self.rank}: {exc}") from exc
        finally:
            self._busy_since = None
        for peer, (_, _, pid, mib, turns) in zip(self.peers, table, strict=True):
            peer.pid, peer.active_mib, peer.turns = pid, mib, turns
        sums = {r: row[1] for r, row in enumerate(table)}
        if len(set(sums.values())) > 1:
            raise GroupFailed(f"the ranks sampled different tokens in step {self.turns} (checksums {sums}); "
                              "their shards no longer agree")
        self.turns += 1
        self._last_turn = time.monotonic()
        self._bound = self.timeout
        if not self.ready.is_set():
            self.ready.set()
            if self.rank == 0:
                print(f"{READY_LINE} ({self.size} ranks, {self.split} parallel, {self.backend})", file=sys.stderr,
                      flush=True)
        return payload

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's `values` (the same count on each), by rank: a collective that every rank
        calls at the same point of the same step. Raises GroupFailed when it fails."""
        import mlx.core as mx
        import numpy as np

        if self.failed is not None:
            raise GroupFailed(self.failed)
        stream = mx.gpu if self.backend == "nccl" else mx.cpu
        before, self._busy_since = self._busy_since, self._busy_since or time.monotonic()
        try:
            table = mx.distributed.all_gather(mx.array([values], dtype=mx.int32), group=self.group, stream=stream)
            return np.array(table).tolist()
        except Exception as exc:
            raise GroupFailed(f"a collective failed on rank {self.rank}: {exc}") from exc
        finally:
            self._busy_since = before

    def begin_step(self) -> None:
        """The forward passes of a step start (they wait on the other ranks too)."""
        self._busy_since = time.monotonic()

    def end_step(self) -> None:
        self._busy_since = None

    # -- failure ---------------------------------------------------------------------------------

    def on_failure(self, handler: Callable[[str], None]) -> None:
        self._on_failure.append(handler)

    def fail(self, reason: str) -> None:
        """Fail the group once: handlers first (rank 0 answers its requests), then exit so the
        group can be started again."""
        with self._lock:
            if self.failed is not None:
                return
            self.failed = reason
        print(f"{FAILURE_LINE}{reason}", file=sys.stderr, flush=True)
        for handler in self._on_failure:
            try:
                handler(reason)
            except Exception:  # pragma: no cover - the exit below must happen regardless
                log.exception("rank failure handler failed")
        delay = GRACE if self.rank == 0 else 0.0
        threading.Timer(delay, lambda: os._exit(EXIT_GROUP_FAILED)).start()

    def _watchdog(self) -> None:
        while self.failed is None:
            time.sleep(0.25)
            now, busy = time.monotonic(), self._busy_since
            if busy is not None and now - busy > self._bound:
                self.fail(f"a step waited more than {self._bound:g} s on the other ranks (--rank-timeout); "
                          "a rank stopped answering")
            elif self.rank != 0 and now - self._last_turn > self._bound + HEARTBEAT:
                self.fail(f"rank {self.rank} heard nothing from rank 0 for {self._bound:g} s")

    def status(self) -> dict[str, Any]:
        """What /health reports of the group."""
        return {"size": self.size, "backend": self.backend, "model": self.model_id, "split": self.split,
                "state": "failed" if self.failed else "serving", "failure": self.failed,
                "restarts": self.restarts, "last_failure": self.last_failure, "steps": self.turns,
                "ranks": [{"rank": p.rank, "address": p.address, "pid": p.pid, "active_mib": p.active_mib,
                           "steps": p.turns} for p in self.peers]}


_GROUP: RankGroup | None = None


def current() -> RankGroup | None:
    """The group this process is a rank of, if any."""
    return _GROUP


def group_of(model: LoadedModel) -> RankGroup | None:
    """The group holding the other shards of a model split across ranks; None for a whole model."""
    return model.beside.get(RankGroup)


def shard_name(group: RankGroup | None) -> str:
    """What a rank's prompt cache blocks on disk are named by besides the model: its shard ("" for a
    whole model). Each rank keeps its own blocks; the ranks agree on what they resume (serving/scheduler.py)."""
    return "" if group is None else f"rank{group.rank}of{group.size}"


def join(backend: str, timeout: float, startup_timeout: float, *, restarts: int = 0,
         last_failure: str | None = None) -> RankGroup:
    """Join the group the environment describes (MLX_RANK, MLX_HOSTFILE or NCCL_*), as mlx.launch
    sets it; bounded, since init waits for every rank to connect."""
    import mlx.core as mx

    global _GROUP
    result: dict[str, Any] = {}

    def init() -> None:
        try:
            result["group"] = mx.distributed.init(strict=True, backend=backend)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=init, name="swama-rank-join", daemon=True)
    thread.start()
    thread.join(startup_timeout)
    if "group" not in result:
        reason = result.get("error") or f"the other ranks did not connect within {startup_timeout:g} s"
        raise GroupFailed(f"rank {os.environ.get('MLX_RANK', '?')} could not join the {backend} group: {reason}")
    _GROUP = RankGroup(result["group"], backend, timeout, startup_timeout, restarts=restarts,
                       last_failure=last_failure)
    _GROUP.doorbell = open_doorbell(_GROUP.rank, _GROUP.size, _GROUP.peers[0].address, _GROUP.gather,
                                    min(startup_timeout, DOORBELL_TIMEOUT))
    return _GROUP
