"""A minimal HTTP/1.1 keep-alive client on asyncio streams, for the load generator.

Requests are encoded once up front and responses are parsed only as far as status and length, so
the client spends as little CPU as possible on a machine it shares with the server it measures.
"""

from __future__ import annotations

import asyncio

HOST = "127.0.0.1"


def encode_request(method: str, path: str, body: bytes | None = None, key: str | None = None) -> bytes:
    """The request's bytes; with ``key``, it carries ``Authorization: Bearer <key>``."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n"
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    if body is None:
        return (head + "\r\n").encode()
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class Connection:
    """One keep-alive connection; it reconnects by itself when the server asks to close."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _ensure(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(HOST, self.port, limit=1 << 20)
        return self._reader, self._writer

    async def send(self, raw: bytes) -> None:
        """Write a request without waiting for its answer (for the disconnect scenario)."""
        _, writer = await self._ensure()
        writer.write(raw)
        await writer.drain()

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        await self.send(raw)
        return await self.read_response()

    async def read_response(self) -> tuple[int, bytes]:
        reader, _ = await self._ensure()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        headers = head.lower()
        if b"transfer-encoding: chunked" in headers:
            body = await _read_chunked(reader)
        else:
            start = headers.find(b"content-length:")
            length = int(headers[start + 15 : headers.find(b"\r\n", start)]) if start >= 0 else 0
            body = await reader.readexactly(length)
        if b"connection: close" in headers:
            self.close()
        return status, body

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def get(port: int, path: str) -> tuple[int, bytes]:
    """One GET on a fresh connection (for /metrics scrapes beside the load)."""
    connection = Connection(port)
    try:
        return await connection.request(encode_request("GET", path))
    finally:
        connection.close()
