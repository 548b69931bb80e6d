"""A real TCP proxy for tests, with faults on demand.

Put it between a client and a server (Redis, the gateway) on 127.0.0.1 and
point the client at :attr:`FaultProxy.port`. Bytes are forwarded both ways
unchanged; a test injects faults with:

* :meth:`FaultProxy.drop_reply_after` (``marker``): once client->server data
  holding ``marker`` was forwarded, the next server->client data of that
  connection is swallowed and both sides of the connection are aborted. That
  is "the request was executed but its reply was lost".
* :meth:`FaultProxy.cut_all`: abort every current connection (both sides).
* :attr:`FaultProxy.refusing`: while true, new connections are accepted and
  aborted at once (a backend that is down), without closing the listener.
* :meth:`FaultProxy.close`: stop listening and abort everything (down for good:
  reconnecting gets "connection refused").

Counters: :attr:`FaultProxy.accepted` (connections accepted, including refused
ones), :attr:`FaultProxy.refused`, :attr:`FaultProxy.dropped` (replies
swallowed), :attr:`FaultProxy.active` (connections open now).

With ``websocket=True`` the proxy also decodes the client's WebSocket frames
(after the HTTP upgrade) to search the marker in their *unmasked* payloads:
a WebSocket client masks every frame it sends, so its bytes on the wire never
contain the marker as such. What is forwarded is still the original bytes.

.. code-block:: python

    async with FaultProxy("127.0.0.1", redis_port) as proxy:
        store_url = f"redis://127.0.0.1:{proxy.port}/0"
        proxy.drop_reply_after(b"some bytes only the append carries")
        ...  # the append runs, its reply is lost, the client retries
        assert proxy.dropped == 1
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from .conftest import free_port

__all__ = ["FaultProxy", "WebSocketPayloads"]

CHUNK = 65536


class WebSocketPayloads:
    """Incremental decoder of one client->server WebSocket byte stream.

    :meth:`feed` takes the raw bytes in arrival order and returns the bytes to
    search for a marker: the HTTP upgrade request as it is, then the unmasked
    payload of every frame (control frames included). Frames may be split or
    joined across reads in any way.
    """

    def __init__(self) -> None:
        self._handshake = True
        self._head = b""  # bytes of a frame header not complete yet
        self._key = b""  # the current frame's masking key (empty: unmasked)
        self._remaining = 0  # payload bytes of the current frame still to come
        self._position = 0  # index into the current frame's payload

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        if self._handshake:
            before = len(self._head)  # handshake bytes returned by earlier calls
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > 65536:  # not an HTTP request: give up decoding
                    self._handshake, self._head = False, b""
                return data
            split = end + 4 - before
            out += data[:split]
            data, self._head, self._handshake = data[split:], b"", False
        buffer = self._head + data
        self._head = b""
        index = 0
        while index < len(buffer):
            if self._remaining:
                take = min(self._remaining, len(buffer) - index)
                out += self._unmask(buffer[index : index + take])
                index += take
                self._remaining -= take
                continue
            header = self._parse_header(buffer, index)
            if header is None:
                self._head = buffer[index:]
                break
            index, self._remaining, self._key = header
            self._position = 0
        return bytes(out)

    @staticmethod
    def _parse_header(buffer: bytes, index: int) -> tuple[int, int, bytes] | None:
        """(index after the header, payload length, masking key), or None if incomplete."""
        if len(buffer) - index < 2:
            return None
        second = buffer[index + 1]
        length, at = second & 0x7F, index + 2
        if length == 126:
            if len(buffer) - at < 2:
                return None
            length, at = int.from_bytes(buffer[at : at + 2], "big"), at + 2
        elif length == 127:
            if len(buffer) - at < 8:
                return None
            length, at = int.from_bytes(buffer[at : at + 8], "big"), at + 8
        key = b""
        if second & 0x80:
            if len(buffer) - at < 4:
                return None
            key, at = buffer[at : at + 4], at + 4
        return at, length, key

    def _unmask(self, chunk: bytes) -> bytes:
        if not self._key:
            self._position += len(chunk)
            return chunk
        shift = self._position % 4
        key = self._key[shift:] + self._key[:shift]
        stream = (key * (len(chunk) // 4 + 1))[: len(chunk)]
        self._position += len(chunk)
        plain = int.from_bytes(chunk, "big") ^ int.from_bytes(stream, "big")
        return plain.to_bytes(len(chunk), "big")


@dataclass(eq=False)
class _Connection:
    """One proxied connection: the client's and the server's stream writers."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    drop_next_reply: bool = False
    decoder: WebSocketPayloads | None = None
    tail: bytes = b""  # the end of the last searched bytes: a marker may span reads
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.server):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """A TCP proxy on 127.0.0.1 to ``target_host:target_port`` (see the module docstring).

    Listens on *port* (default: a free port below the ephemeral range, so a
    client that reconnects after :meth:`close` cannot connect to itself).
    Use it as ``async with FaultProxy(...) as proxy`` or call :meth:`start`
    and :meth:`close`.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        port: int | None = None,
        websocket: bool = False,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = "127.0.0.1"
        self.port = port or 0
        self.websocket = websocket
        self.accepted = 0
        """Connections accepted since the start (refused ones included)."""
        self.refused = 0
        """Connections aborted at once because :attr:`refusing` was set."""
        self.dropped = 0
        """Server replies swallowed by :meth:`drop_reply_after`."""
        self.refusing = False
        """While true, a new connection is aborted as soon as it is accepted."""
        self._markers: list[bytes] = []
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._dropped_changed = asyncio.Condition()
        self._fixed_port = port is not None

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        """Start listening; returns the proxy. Retries another free port if one is taken."""
        for _ in range(20):
            port = self.port if self._fixed_port else free_port()
            try:
                self._server = await asyncio.start_server(self._accept, self.host, port)
            except OSError:
                if self._fixed_port:
                    raise
                continue
            self.port = port
            return self
        raise RuntimeError("the proxy found no free port")

    async def close(self) -> None:
        """Stop listening and abort every connection: the backend is gone for good."""
        if self._server is not None:
            self._server.close()
        self.cut_all()
        # Wait for the connection handlers to finish (Python 3.11's
        # Server.wait_closed does not), so none is cancelled with the loop.
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- faults -------------------------------------------------------------------------

    def drop_reply_after(self, marker: bytes, *, times: int = 1) -> None:
        """Lose the reply to the next request holding *marker*, *times* times over.

        Each arming is used up by the first connection whose client->server
        data holds *marker* (searched across read boundaries; in WebSocket
        mode, in the unmasked payloads). The request itself is forwarded;
        the next server->client data of that connection is not, and both
        sides are aborted (the client sees the connection reset).
        """
        if not marker:
            raise ValueError("the marker must not be empty")
        self._markers += [marker] * times

    @property
    def armed(self) -> int:
        """Markers armed and not used up yet."""
        return len(self._markers)

    def cut_all(self) -> int:
        """Abort every open connection, both sides; returns how many there were."""
        connections = list(self._connections)
        for conn in connections:
            conn.abort()
        return len(connections)

    @property
    def active(self) -> int:
        """Connections open now."""
        return len(self._connections)

    async def wait_dropped(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until at least *count* replies were dropped (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout), self._dropped_changed:
            await self._dropped_changed.wait_for(lambda: self.dropped >= count)

    # -- forwarding -------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        if self.refusing:
            self.refused += 1
            writer.transport.abort()
            return
        conn = _Connection(writer, decoder=WebSocketPayloads() if self.websocket else None)
        self._connections.add(conn)
        try:
            try:
                server_reader, conn.server = await asyncio.wait_for(
                    asyncio.open_connection(self.target_host, self.target_port), 10
                )
            except (OSError, TimeoutError):
                return  # the target is down: the client sees its connection closed
            upstream = asyncio.create_task(self._client_to_server(conn, reader))
            downstream = asyncio.create_task(self._server_to_client(conn, server_reader))
            conn.tasks = [upstream, downstream]
            await asyncio.gather(upstream, downstream, return_exceptions=True)
        finally:
            self._connections.discard(conn)
            for side in (conn.client, conn.server):
                if side is not None:
                    side.close()  # flushes what is buffered; a no-op after an abort
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(side.wait_closed(), 5)

    def _holds_marker(self, conn: _Connection, data: bytes) -> bool:
        """Whether *data* completes an armed marker; uses up that arming."""
        searched = conn.decoder.feed(data) if conn.decoder is not None else data
        if not self._markers:
            conn.tail = b""
            return False
        window = conn.tail + searched
        keep = max(len(m) for m in self._markers) - 1
        conn.tail = window[-keep:] if keep else b""
        for index, marker in enumerate(self._markers):
            if marker in window:
                del self._markers[index]
                return True
        return False

    async def _client_to_server(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        assert conn.server is not None
        try:
            while data := await reader.read(CHUNK):
                if self._holds_marker(conn, data):
                    conn.drop_next_reply = True  # before forwarding: the reply cannot slip by
                conn.server.write(data)
                await conn.server.drain()
            if conn.server.can_write_eof():
                conn.server.write_eof()
        except (OSError, RuntimeError):
            conn.abort()

    async def _server_to_client(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(CHUNK):
                if conn.drop_next_reply:
                    conn.abort()
                    self.dropped += 1
                    async with self._dropped_changed:
                        self._dropped_changed.notify_all()
                    return
                conn.client.write(data)
                await conn.client.drain()
            if conn.client.can_write_eof():
                conn.client.write_eof()
        except (OSError, RuntimeError):
            conn.abort()
