"""The HTML report in a real headless Chromium, driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages ending in NUL on file descriptors 3 and 4; no port,
no websocket, no extra package).

What a person would see: no console error or uncaught exception, no request leaving the file
(the page is self-contained), one table row per trial, every plot drawn by plotly (an
``svg.main-svg`` with drawn paths), and the table's sort and filter working. The first test
proves the harness catches a deliberate error, so the checks can fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from test_explain import cli, make_bundle

from dossier.bundle import open_bundle

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="no headless chromium at /usr/bin/chromium "
                       "(apt-get install chromium)"),
]


class Browser:
    """Headless Chromium driven over --remote-debugging-pipe."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="dossier-chromium-")
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()

        def fds() -> None:  # the child reads commands on fd 3 and writes replies on fd 4
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={self.profile}",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.w, self.r = to_chrome_w, from_chrome_r
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def _read(self, timeout: float) -> dict[str, Any] | None:
        end = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 16)
                if not chunk:
                    raise EOFError("chromium closed the DevTools pipe")
                self.buf += chunk
        message, _, self.buf = self.buf.partition(b"\0")
        return json.loads(message)  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = True, timeout: float = 30) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            reply = self._read(end - time.monotonic())
            if reply is None:
                break
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]
            self.events.append(reply)
        raise TimeoutError(f"no reply to {method} within {timeout} s")

    def open(self, page: Path) -> None:
        """Open a page in a fresh tab and wait for its load event."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.call("Target.attachToTarget", {"targetId": target["targetId"],
                                                           "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Runtime", "Page", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", {"url": page.resolve().as_uri()})
        end = time.monotonic() + 60
        while time.monotonic() < end:
            event = self._read(end - time.monotonic())
            if event is None:
                break
            self.events.append(event)
            if event.get("method") == "Page.loadEventFired":
                return
        raise TimeoutError(f"{page} did not finish loading")

    def settle(self, seconds: float = 0.5) -> None:
        """Collect the events of the next ``seconds`` (timers, promise callbacks)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            event = self._read(left)
            if event is not None:
                self.events.append(event)

    def eval(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in res:
            raise AssertionError(f"{expression}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error/assert calls and error log entries so far."""
        found = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                found.append(f"{d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                found.append("console." + p["type"] + ": " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                found.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return found

    def requests(self) -> list[str]:
        """URLs the page asked for (beyond its own file: nothing, for a self-contained page)."""
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close", session=False, timeout=5)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.w)
        with contextlib.suppress(OSError):
            os.close(self.r)
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture()
def browser():
    b = Browser()
    try:
        yield b
    finally:
        b.close()


def test_the_harness_catches_a_console_error(browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><table><tr data-trial='0'><td>x</td></tr>"
                    "</table><script>console.error('deliberate'); undefinedFunction();"
                    "</script></body></html>")
    browser.open(page)
    browser.settle(0.2)
    errors = browser.errors()
    assert any("undefinedFunction is not defined" in e for e in errors), errors
    assert any("console.error: deliberate" in e for e in errors), errors
    assert browser.eval("document.querySelectorAll('tr[data-trial]').length") == 1


def test_the_report_renders_in_a_real_browser(browser: Browser, tmp_path: Path,
                                              tmp_path_factory: pytest.TempPathFactory,
                                              samples_dir: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    bundle = make_bundle(tmp_path_factory.mktemp("browser"), samples_dir, "faulty")
    page = tmp_path / "report.html"
    res = cli("explain", bundle, "--html", page)
    assert res.exit_code == 0, res.stderr
    with open_bundle(bundle) as b:
        trials = b.tuning_cache().trials
    browser.open(page)
    browser.settle(0.5)
    assert browser.errors() == []
    assert browser.requests() == [page.resolve().as_uri()]  # self-contained: nothing else
    rows = browser.eval("Array.from(document.querySelectorAll('tr[data-trial]'))"
                        ".map(r => r.getAttribute('data-trial'))")
    assert rows == [str(t.index) for t in trials]
    plots = browser.eval("""Array.from(document.querySelectorAll('div[id^="plot-"]')).map(d => ({
        id: d.id, svgs: d.querySelectorAll('svg.main-svg').length,
        paths: Array.from(d.querySelectorAll('svg.main-svg path'))
               .filter(p => (p.getAttribute('d') || '').length > 2).length,
        traces: d.querySelectorAll('g.trace').length}))""")
    assert [p["id"] for p in plots] == ["plot-latency", "plot-accuracy", "plot-search",
                                        "plot-knobs"]
    for p in plots:  # drawn by plotly: an svg with traces and drawn paths
        assert p["svgs"] >= 1 and p["traces"] >= 1 and p["paths"] >= 3, p
    rejected = browser.eval("getComputedStyle(document.querySelector('tr.o-rejected "
                            "td:nth-child(3)')).color")
    assert rejected == "rgb(179, 107, 0)"  # outcomes coloured
    # sort: click '#' twice -> descending trial order
    browser.eval("document.querySelector('#trials th[data-col=\"0\"]').click();"
                 "document.querySelector('#trials th[data-col=\"0\"]').click(); 0")
    order = browser.eval("Array.from(document.querySelectorAll('#trials tbody tr'))"
                         ".map(r => +r.getAttribute('data-trial'))")
    assert order == sorted((t.index for t in trials), reverse=True)
    # filter: only the build failure stays visible
    browser.eval("const f = document.getElementById('filter'); f.value = 'injected build';"
                 "f.dispatchEvent(new Event('input')); 0")
    visible = browser.eval("Array.from(document.querySelectorAll('#trials tbody tr'))"
                           ".filter(r => r.style.display !== 'none')"
                           ".map(r => r.querySelector('td:nth-child(3)').textContent)")
    assert visible == ["build_failed"]
    assert browser.errors() == []


def test_routes_wrap_between_knobs_and_the_latency_axis_fits(
        browser: Browser, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        samples_dir: Path) -> None:
    """In a narrow window a route wraps between its knobs, never after a knob's leading dash;
    the latency plot's axis is fitted to the samples, not drawn from zero to a straggler."""
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    bundle = make_bundle(tmp_path_factory.mktemp("browser"), samples_dir, "faulty")
    page = tmp_path / "report.html"
    assert cli("explain", bundle, "--html", page).exit_code == 0
    browser.open(page)
    browser.call("Emulation.setDeviceMetricsOverride", {"width": 360, "height": 800,
                                                        "deviceScaleFactor": 1, "mobile": False})
    browser.settle(0.5)
    routes = browser.eval("""Array.from(document.querySelectorAll('code, b, span.route'))
        .filter(e => e.textContent.trim().startsWith('-'))
        .map(e => ({text: e.textContent.replace(/\\s+/g, ' ').trim(),
                    toks: Array.from(e.querySelectorAll('span.tok')).map(s => s.textContent),
                    lines: e.getClientRects().length,
                    broken: Array.from(e.querySelectorAll('span.tok'))
                            .filter(s => s.getClientRects().length > 1).length}))""")
    assert routes, "no route on the page"
    for r in routes:  # every knob in one unbreakable piece, and nothing outside them
        assert r["toks"] and " ".join(r["toks"]) == r["text"] and r["broken"] == 0, r
    assert max(r["lines"] for r in routes) > 1  # the window is narrow enough to wrap them
    axis = browser.eval("""(() => { const a = document.getElementById('plot-latency')
        ._fullLayout.yaxis; return {type: a.type, range: a.range}; })()""")
    low, high = (10 ** v for v in axis["range"]) if axis["type"] == "log" else axis["range"]
    from dossier.formats.report import samples_from_timings

    with open_bundle(bundle) as b:  # what the plot draws: each trial's samples per inference
        samples = samples_from_timings(b.timings())
        n = max(b.tuning_cache().header.per_sample, 1)
    medians = [statistics.median(x) / n for x in samples.values() if x]
    assert medians and 0 < low < min(medians) and max(medians) < high
    assert browser.errors() == []
