"""Messages between the server process and its engine process: pickled, length-prefixed, over a
pair of Unix sockets, one each way.

The engine process writes from several threads (its event loop, and the scheduler threads, which
send each step's tokens themselves without waking the loop): `Sender` is a blocking, locked writer.
Each side reads its socket on its event loop (`frames`). The sockets are a socketpair this server
made for its own child, so what comes through them is trusted.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import threading
from collections.abc import AsyncIterator
from typing import Any

HEADER = struct.Struct("!I")


def encode(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


class Sender:
    """Blocking writes of whole messages, from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        frame = encode(message)
        with self._lock:
            self.sock.sendall(frame)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


async def frames(reader: asyncio.StreamReader) -> AsyncIterator[Any]:
    """The messages on `reader` until the other side closes it."""
    while True:
        try:
            header = await reader.readexactly(HEADER.size)
            data = await reader.readexactly(HEADER.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        yield pickle.loads(data)


async def connect(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Stream ends over `sock` for this event loop. Keep both: a writer that is dropped closes the socket."""
    return await asyncio.open_unix_connection(sock=sock, limit=1 << 24)
