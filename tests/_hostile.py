"""Helpers of the hostile-input tests, shared by the modules of the concepts they test (names,
the registry, what reaches the terminal, small files, serving inputs, spec paths, ``verify
--rebench``). Not collected.

A bundle crafted the way an attacker who knows the format would (``_craft``: the manifest edited
as JSON and sealed again), text full of terminal control sequences, a FIFO where a small file
is read, a call that must return within a time, and an HTTP server on 127.0.0.1 that answers
as a registry never would. The fixtures built on them (``hostile``, ``host``) are conftest's.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bundles as h
import pytest

CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"]
HOSTILE_TEXT = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b2J\r"


def _no_controls(text: str) -> bool:
    return not any(c in text for c in CONTROLS)


def _craft(bundle: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Edit ``bundle``'s manifest.json as JSON and seal it again (a new dossier id), the way an
    attacker who knows the format would: the bundle stays intact by its own checks."""
    h.reseal(bundle, edit)
    return bundle


def _release(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        raw["release"] = name
    return edit


def _everything(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


ESCAPES = ["../../escaped", "{tmp}/abs-escaped", "a/../../escaped", "escaped\n\x1b[2J"]
"""Crafted release names; ``{tmp}`` stands for the test's own temporary folder (absolute)."""


def _pair(bundle: Path) -> Any:
    """The first pair of ``bundle``'s validation set."""
    from dossier.validation import load_validation_set

    return load_validation_set(bundle / "validation").pairs[0]


def _fifo(path: Path) -> Path:
    """A FIFO at ``path`` (in place of what was there); nobody writes to it."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or the exception it raised, run in a thread; fails the test when it
    has not returned after ``seconds`` (it hangs: a FIFO nobody writes to blocks its reader for
    ever, a server that trickles bytes holds a client without a deadline)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"still blocked after {seconds} s: it hangs")
    return out[0]


class Hostile:
    """An HTTP server on 127.0.0.1 whose every request is answered by ``behave(handler)``;
    it records the paths asked for."""

    def __init__(self, behave: Callable[[Any], None]) -> None:
        self.paths: list[str] = []
        self.stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.paths.append(self.path)
                try:
                    behave(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_HEAD = do_POST = do_PUT = _any

            def log_message(self, *args: Any) -> None:
                pass

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up on purpose

        self.server = Quiet(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _ok_version(handler: Any) -> bool:
    """Answer the registry version check (``GET /v2/``) as a registry does; False for any
    other request (left to the caller)."""
    if handler.path == "/v2/":
        handler.send_response(200)
        handler.send_header("Content-Length", "2")
        handler.end_headers()
        handler.wfile.write(b"{}")
        return True
    return False
