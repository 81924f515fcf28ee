"""The registry client's HTTP transport: a deadline on every whole response, a cap on every
body read whole, and timeouts on every request (the token service's too).

requests applies its timeouts per socket read, so a server sending one byte every few seconds
keeps a response alive forever. Here every request through the session gets a deadline for the
whole exchange (connect, send, headers, body): when it passes, the connection's socket is shut
down from a timer thread, which ends any read or write blocked on it, and the request fails
with :class:`~dossier.errors.RegistryError` saying so. The deadline is :data:`DEADLINE_S`, plus
the time the bytes the caller expects (a blob's declared size, an upload's size) take at
:data:`MIN_RATE` bytes a second: a registry's own claim (Content-Length) never extends it.

A response asked for whole (not streamed: the token service's, oras-py's own) is read through
a cap of :data:`BODY_MAX_BYTES`; a larger body is refused, not buffered.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from dossier.errors import RegistryError

DEADLINE_S = 300.0
"""Seconds one request may take from connect to its body's last byte (plus the time of the
bytes expected, at :data:`MIN_RATE`)."""
MIN_RATE = 1 << 20
"""Bytes a second a registry must at least deliver of what is expected (1 MiB/s)."""
TIMEOUT_S = (10.0, 60.0)
"""(connect, read) timeouts of every request, in seconds: the default of requests made without
one (oras-py's token requests)."""
BODY_MAX_BYTES = 1 << 20
"""A body read whole (a token service's answer) larger than this is refused."""

_local = threading.local()


class Deadline:
    """The deadline of one request: the connections it uses are shut when it passes."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds, self.what = seconds, what
        self.expired = False
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, conn: Any) -> None:
        with self._lock:
            self._conns.append(conn)
            fired = self.expired
        if fired:
            _shut(conn)

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            conns = list(self._conns)
        for conn in conns:
            _shut(conn)

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._conns.clear()

    def error(self) -> RegistryError:
        return RegistryError(f"{self.what} took longer than {self.seconds:.0f} s; given up",
                             hint="the registry is too slow or stalls; nothing was kept")


def _shut(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def deadline_of(r: Any) -> Deadline | None:
    """The deadline of the response ``r`` (None for one not sent through :class:`Transport`)."""
    return getattr(r, "_dossier_deadline", None)


@contextmanager
def expecting(nbytes: int, what: str) -> Iterator[None]:
    """Requests sent in this block expect ``nbytes`` (sent or received): their deadline grows
    by the time those take at :data:`MIN_RATE`."""
    old = getattr(_local, "expect", None)
    _local.expect = (max(0, nbytes), what)
    try:
        yield
    finally:
        _local.expect = old


def _watch(conn: Any) -> None:
    current = getattr(_local, "deadline", None)
    if current is not None:
        current.watch(conn)


class _Watched:
    """A connection whose socket the deadline of the exchange under way may shut."""

    def connect(self) -> None:
        _watch(self)
        super().connect()  # type: ignore[misc]

    def request(self, *args: Any, **kw: Any) -> None:
        _watch(self)
        super().request(*args, **kw)  # type: ignore[misc]


class _Conn(_Watched, HTTPConnection):
    pass


class _SConn(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Conn


class _SPool(HTTPSConnectionPool):
    ConnectionCls = _SConn


class Transport(HTTPAdapter):
    """An HTTP adapter with a deadline on every request and a cap on every body read whole
    (see the module docstring). Mount it on a session for ``http://`` and ``https://``."""

    def init_poolmanager(self, *args: Any, **kw: Any) -> None:
        super().init_poolmanager(*args, **kw)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _SPool}

    def send(self, request: Any, stream: bool = False, timeout: Any = None,  # type: ignore[override]
             **kw: Any) -> Any:
        nbytes, what = getattr(_local, "expect", None) or (0, None)
        deadline = Deadline(DEADLINE_S + nbytes / MIN_RATE,
                            what or f"{request.method} {urlsplit(request.url).path[:120]}")
        outer = getattr(_local, "deadline", None)
        _local.deadline = deadline
        try:
            r: Any = super().send(request, stream=True, timeout=timeout or TIMEOUT_S, **kw)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            deadline.cancel()
            if deadline.expired:
                raise deadline.error() from None
            raise
        except BaseException:
            deadline.cancel()
            raise
        finally:
            _local.deadline = outer
        r._dossier_deadline = deadline
        close = r.close

        def closing() -> None:
            deadline.cancel()
            close()

        r.close = closing
        if not stream:  # read whole here, capped (requests would read it whole, unbounded)
            try:
                body = read_body(r, BODY_MAX_BYTES, what or "a response", decode=True)
            except BaseException:
                r.close()
                raise
            deadline.cancel()  # before the connection may serve another request
            r._content, r._content_consumed = body, True
            r.raw.release_conn()  # read to its end: kept alive for the next request
        return r


def stream_body(r: Any, what: str, chunk: int, *, decode: bool = False) -> Iterator[bytes]:
    """The body of the streamed response ``r``, chunk by chunk: raw, or with ``decode`` its
    Content-Encoding (gzip...) undone, chunk by chunk too; RegistryError when the connection
    fails or its deadline passes."""
    deadline = deadline_of(r)
    try:
        for data in r.raw.stream(chunk, decode_content=decode):
            if deadline is not None and deadline.expired:
                raise deadline.error()
            yield data
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        if deadline is not None and deadline.expired:
            raise deadline.error() from None
        raise RegistryError(f"the registry failed while sending {what} "
                            f"({type(exc).__name__})", hint="nothing was kept; try again"
                            ) from None
    if deadline is not None and deadline.expired:  # shut: the stream ended early
        raise deadline.error()


def read_body(r: Any, cap: int, what: str, *, refuse: bool = True,
              decode: bool = False) -> bytes:
    """At most ``cap`` bytes of the body of ``r`` (decoded with ``decode``); a larger body is
    RegistryError (or, with ``refuse=False``, cut at ``cap``). Never much more than ``cap`` is
    held, decoded or not."""
    out = bytearray()
    for data in stream_body(r, what, 64 << 10, decode=decode):
        out += data
        if len(out) > cap:
            if refuse:
                raise RegistryError(f"{what}: the registry sent more than {cap} bytes; refused")
            return bytes(out[:cap])
    return bytes(out)


def mount(session: requests.Session) -> None:
    """Mount :class:`Transport` on ``session`` for ``http://`` and ``https://``."""
    transport = Transport()
    session.mount("http://", transport)
    session.mount("https://", transport)


__all__ = ["BODY_MAX_BYTES", "DEADLINE_S", "MIN_RATE", "TIMEOUT_S", "Deadline", "Transport",
           "deadline_of", "expecting", "mount", "read_body", "stream_body"]
