"""A doorbell from rank 0 to the other ranks: one byte over a plain TCP connection before each shared
plan, so a rank with nothing to do sleeps in the kernel instead of in a collective.

MLX's ring backend waits in a collective by polling non-blocking sockets: a rank waiting on rank 0
for the next plan keeps a core busy (two, measured, on an idle two-rank server), and an idle server
waits between plans all the time. With the doorbell a rank enters the collective only once rank 0 is
about to; the wait before it is a blocking `recv`, bounded by the group's timeout. A closed
connection says rank 0 is gone at once.

Rank 0 listens on its own ring address (an ephemeral port, told to the others through a collective)
and accepts one connection from each rank, which names itself. Every rank then says whether its
side is up; unless all are, no rank uses the doorbell (and idle ranks poll as MLX does).
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Callable

from swama.engine.errors import Unavailable

log = logging.getLogger("swama.ranks")

RING = b"\x01"


class DoorbellClosed(Unavailable):
    """The other side of a doorbell connection is gone, or stayed silent past the bound (the group
    turns it into its GroupFailed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="rank_failed")


class Doorbell:
    def __init__(self, rank: int, peers: dict[int, socket.socket]) -> None:
        self.rank = rank
        self._peers = peers  # rank 0: every other rank's connection; another rank: {0: rank 0's}

    def ring(self) -> None:
        """Rank 0: a plan follows."""
        for rank, conn in self._peers.items():
            try:
                conn.sendall(RING)
            except OSError as exc:
                raise DoorbellClosed(f"rank {rank}'s connection closed ({exc})") from exc

    def wait(self, timeout: float) -> None:
        """Another rank: until rank 0 rings (at most `timeout` seconds)."""
        conn = self._peers[0]
        conn.settimeout(timeout)
        try:
            got = conn.recv(1)
        except TimeoutError as exc:
            raise DoorbellClosed(f"rank {self.rank} heard nothing from rank 0 for {timeout:g} s") from exc
        except OSError as exc:
            raise DoorbellClosed(f"rank 0's connection failed ({exc})") from exc
        if got != RING:
            raise DoorbellClosed("rank 0 closed its connection (it stopped)")


def _host(address: str) -> str:
    """The host of a rank's first ring address ("ip:port", several joined by commas)."""
    first = address.split(",")[0].strip()
    host = first.rsplit(":", 1)[0] if first.count(":") == 1 else first
    return host.strip("[]") or "127.0.0.1"


def open_doorbell(rank: int, size: int, rank0_address: str, gather: Callable[[list[int]], list[list[int]]],
                  timeout: float) -> Doorbell | None:
    """Every rank calls this at the same point, once the group is joined; None where any side failed."""
    conn: dict[int, socket.socket] = {}
    listener = None
    port = 0
    if rank == 0:
        try:
            listener = socket.create_server((_host(rank0_address), 0))
            port = listener.getsockname()[1]
        except OSError as exc:
            log.warning("rank 0 could not listen for its doorbell (%s); idle ranks will poll", exc)
    port = gather([port])[0][0]
    ok = 0
    try:
        if rank == 0 and listener is not None:
            deadline = time.monotonic() + timeout
            while len(conn) < size - 1:
                listener.settimeout(max(0.01, deadline - time.monotonic()))
                peer, _ = listener.accept()
                peer.settimeout(timeout)
                header = peer.recv(4, socket.MSG_WAITALL)
                if len(header) != 4:
                    raise ConnectionError("a rank closed its doorbell before it named itself")
                (named,) = struct.unpack("<i", header)
                if not 0 < named < size or named in conn:
                    peer.close()
                    continue
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn[named] = peer
            ok = 1
        elif rank != 0 and port:
            peer = socket.create_connection((_host(rank0_address), port), timeout=timeout)
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer.sendall(struct.pack("<i", rank))
            conn[0] = peer
            ok = 1
    except OSError as exc:
        log.warning("rank %d could not connect its doorbell (%s); idle ranks will poll", rank, exc)
    finally:
        if listener is not None:
            listener.close()
    if all(row[0] for row in gather([ok])):
        return Doorbell(rank, conn)
    for c in conn.values():
        c.close()
    return None

