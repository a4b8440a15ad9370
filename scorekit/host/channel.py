"""One end of the socket between a front end and its model host: messages framed by a 4-byte length.

Sending never blocks its caller (the event loop, a model worker thread): a message goes into an outbox that a
writer thread encodes and writes, as many messages as are waiting in one ``sendall``. Receiving is blocking and
belongs to one reader thread. When a write fails (the other end is gone), ``on_broken`` is called once.
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import msgspec

from scorekit.host.wire import Message

logger = logging.getLogger("scorekit.host")
_LENGTH = struct.Struct(">I")
# A writer flushes once this many bytes are framed, so one burst of outputs is not held in memory at once.
_FLUSH_BYTES = 1 << 20
_READ_BYTES = 1 << 16
_CLOSE = object()  # in the outbox: flush what came before it, then end the writer


class Channel:
    """Frames ``Message`` s over ``sock``; :meth:`close` (or :meth:`close_write`) ends the writer once it has
    written what was sent before."""

    def __init__(self, sock: socket.socket, *, on_broken: Callable[[], None] = lambda: None, name: str) -> None:
        self._sock = sock
        self._on_broken = on_broken
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._file = io.BufferedReader(socket.SocketIO(sock, "rb"), _READ_BYTES)  # one recv for many small frames
        self._writer = threading.Thread(target=self._write, name=f"{name}-writer", daemon=True)
        self._writer.start()

    def send(self, message: Message) -> None:
        self._outbox.put(message)

    def receive(self) -> Message | None:
        """The next message; None once the other end has closed (or this end was shut down)."""
        header = self._read(_LENGTH.size)
        if header is None:
            return None
        (length,) = _LENGTH.unpack(header)
        body = self._read(length)
        return None if body is None else self._decoder.decode(body)

    def __iter__(self) -> Iterator[Message]:
        while (message := self.receive()) is not None:
            yield message

    def _read(self, size: int) -> bytearray | None:
        """Exactly ``size`` bytes (a bytearray, so tensors decoded from it are writable views), or None at the end."""
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            try:
                count = self._file.readinto(view[got:])
            except (OSError, ValueError):  # ValueError: this end was closed
                return None
            if not count:
                return None
            got += count
        return buffer

    def close_write(self, timeout: float | None = None) -> None:
        """Write what was sent, then shut the socket's sending side: the other end reads to its end, and can still
        answer. Waits at most ``timeout`` for the writer."""
        self._outbox.put(_CLOSE)
        self._writer.join(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Write what was sent (for at most ``timeout``), then close the socket: a reader blocked on it returns."""
        self.close_write(timeout)
        self.shutdown()
        self._file.close()
        self._sock.close()

    def shutdown(self) -> None:
        """End the stream both ways now, without waiting for the writer (so from any thread, its own too): a reader
        blocked on it returns, and the other end reads its end. :meth:`close` still releases the socket."""
        with contextlib.suppress(OSError):  # already gone
            self._sock.shutdown(socket.SHUT_RDWR)

    def _write(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        buffer = bytearray()
        closing = False
        while not closing:
            item = self._outbox.get()
            buffer.clear()
            while True:
                if item is _CLOSE:
                    closing = True
                    break
                start = len(buffer)
                buffer.extend(bytes(_LENGTH.size))
                encoder.encode_into(item, buffer, -1)
                _LENGTH.pack_into(buffer, start, len(buffer) - start - _LENGTH.size)
                if len(buffer) >= _FLUSH_BYTES:
                    break
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
            try:
                if buffer:
                    self._sock.sendall(buffer)
            except OSError as exc:
                logger.debug("the model host's socket broke: %r", exc)
                self._on_broken()
                return
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)
