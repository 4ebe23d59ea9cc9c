"""A lean keep-alive HTTP/1.1 client for the senders: asyncio streams and ``h11`` (the
protocol state machine httpx and uvicorn use; it comes with the ``server`` extra).

    pool = Pool("http://127.0.0.1:8000", size=256, timeout_s=5)
    reply = await pool.post("/api/v1/ingest", body, {"Content-Type": "application/json"})
    reply.status, reply.headers.get("retry-after"), reply.body

Why not ``httpx.AsyncClient``: its pool scans every connection on every request and, without
``sniffio`` installed, tries an import per call; measured here it cost ~4 ms of CPU per
request, as much as the server spends storing the batch, so the generator would measure
itself. This client costs a small fraction of that. One request per connection at a time;
at most ``size`` connections per endpoint (a request waits for one); a connection idle for
longer than ``IDLE_S`` is closed rather than reused (uvicorn drops idle keep-alive
connections after 5 s). A request that fails on a reused connection before any reply byte
arrived is tried once more on a new one (the server closed it meanwhile; ingest is
idempotent on ``batch_id`` anyway). Everything else raises :class:`TransportError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

IDLE_S = 4.0


class TransportError(Exception):
    """No reply: refused, reset, closed, timed out, or not HTTP."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float = 0.0  # from a free connection slot to the reply's end (not the wait for one)


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()
        self.used = False
        self.got_bytes = False

    async def request(self, target: str, headers: list[tuple[str, str]], body: bytes) -> Reply:
        self.got_bytes = False
        h = self.h11
        out = h.send(h11.Request(method="POST", target=target, headers=headers))
        out += h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage())
        self.writer.write(out)
        await self.writer.drain()
        status, got_headers, chunks = 0, {}, []
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                data = await self.reader.read(65536)
                if not data:
                    raise TransportError("connection closed by the server")
                self.got_bytes = True
                h.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
                got_headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise TransportError("connection closed mid-reply")
        self.used = True
        return Reply(status, got_headers, b"".join(chunks))

    @property
    def reusable(self) -> bool:
        h = self.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections to one ``http://host:port`` endpoint."""

    def __init__(self, base: str, *, size: int, timeout_s: float) -> None:
        url = urlsplit(base)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"endpoint {base!r}: the load generator speaks plain http://host:port")
        self.host, self.port = url.hostname, url.port or 80
        self.prefix = url.path.rstrip("/")
        self.authority = url.netloc
        self.timeout_s = timeout_s
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(size)

    async def _open(self) -> _Conn:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Conn(reader, writer)

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Reply:
        fields = [("Host", self.authority), ("Content-Length", str(len(body)))]
        fields += list(headers.items())
        async with self._slots:
            started = time.perf_counter()
            for fresh in (False, True):
                conn = None if fresh else self._take_idle()
                try:
                    async with asyncio.timeout(self.timeout_s):
                        conn = conn or await self._open()
                        reply = await conn.request(self.prefix + path, fields, body)
                except (OSError, TransportError, h11.ProtocolError, TimeoutError) as exc:
                    retry = conn is not None and conn.used and not conn.got_bytes
                    if conn is not None:
                        conn.close()
                    if retry and not isinstance(exc, TimeoutError):
                        continue
                    raise TransportError(f"{type(exc).__name__}: {exc}") from None
                if conn.reusable:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:
                    conn.close()
                return dataclasses.replace(reply, seconds=time.perf_counter() - started)
        raise TransportError("unreachable")  # the loop returns or raises

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
