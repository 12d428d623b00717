"""``python bench/tui.py --browser [PNG]``: a screenshot of the served board in headless Chromium.

A real gpulayerd (:class:`tests.tui.daemon.RealDaemon`: one CPU slot, no GPU) runs one job while two wait
behind it; ``gpulayer tui --serve --port 0`` serves the board; Debian's Chromium (``apt-get install
chromium``), headless and driven over the DevTools protocol, opens the printed URL as any viewer
would (the token and the Origin are checked as for any browser), waits until the Jobs table shows the
jobs, and saves a PNG (default ``/tmp/gpulayer-board-<time>.png``). Prints the PNG's path and how long
the page took from opening to the drawn board. Without Chromium it says so and does nothing (exit 0).

Not part of ``scripts/test``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.tui.daemon import RealDaemon, clean_env, tool

SIZE = (1280, 800)
"""The browser window, pixels."""
DRAWN_TIMEOUT_S = 30.0
CHROMIUMS = ("chromium", "chromium-browser", "google-chrome")
KEEP_TERMINAL_OUTPUT = """
window.__boardOutput = [];
const PageSocket = window.WebSocket;
window.WebSocket = function (...args) {
  const ws = new PageSocket(...args);
  ws.addEventListener("message", (e) => {
    if (e.data instanceof ArrayBuffer) window.__boardOutput.push(new TextDecoder().decode(e.data));
  });
  return ws;
};
window.WebSocket.prototype = PageSocket.prototype;
"""
"""Run in the page before its own scripts: keeps the terminal output its websocket brings (xterm.js draws
it on a canvas, where no text can be read back), so the screenshot waits until the jobs are there."""
OUTPUT_TEXT = r"(window.__boardOutput || []).join('').replace(/\x1b\[[0-9;?]*[ -\/]*[@-~]/g, '')"
"""The terminal output so far, its escape sequences removed."""


def chromium() -> str | None:
    """The Chromium on PATH (Debian's ``chromium`` first)."""
    return next((p for p in map(shutil.which, CHROMIUMS) if p), None)


def start_board(daemon: RealDaemon) -> tuple[subprocess.Popen[str], str]:
    """``gpulayer tui --serve --port 0``; the process and the URL it printed."""
    proc = subprocess.Popen([tool("gpulayer"), "--state-dir", str(daemon.state_dir), "tui", "--serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"http://\S+/\?token=\S+", line)
        if found:
            return proc, found.group(0)
    raise SystemExit(f"gpulayer tui --serve printed no URL (exit {proc.wait()})")


class DevTools:
    """One page of a headless Chromium, over the DevTools protocol (a websocket of JSON messages)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send ``method`` and return its result (events that come meanwhile are dropped)."""
        call_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await self._ws.receive_str(timeout=DRAWN_TIMEOUT_S))
            if msg.get("id") == call_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")


async def screenshot(browser: str, url: str, wanted: list[str], png: Path) -> float:
    """Open ``url`` in a headless ``browser``, wait until the page's terminal shows every ``wanted`` string,
    save a screenshot to ``png``; returns the seconds from opening the page to that."""
    with tempfile.TemporaryDirectory(prefix="glboard-") as profile:
        argv = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                f"--window-size={SIZE[0]},{SIZE[1]}", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                "about:blank"]
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            active = Path(profile) / "DevToolsActivePort"
            end = time.monotonic() + DRAWN_TIMEOUT_S
            while not (active.exists() and len(active.read_text().split()) >= 2):
                if proc.poll() is not None or time.monotonic() > end:
                    raise SystemExit(f"{browser} did not start its DevTools endpoint (exit {proc.poll()})")
                await asyncio.sleep(0.05)
            port = active.read_text().split()[0]
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json() if t.get("type") == "page"]
                async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    tools = DevTools(ws)
                    await tools.call("Emulation.setDeviceMetricsOverride", width=SIZE[0], height=SIZE[1],
                                     deviceScaleFactor=1, mobile=False)
                    await tools.call("Page.enable")
                    await tools.call("Page.addScriptToEvaluateOnNewDocument", source=KEEP_TERMINAL_OUTPUT)
                    start = time.monotonic()
                    await tools.call("Page.navigate", url=url)
                    while True:  # until the terminal output that reached the page holds every wanted string
                        text = await tools.evaluate(OUTPUT_TEXT) or ""
                        if all(w in text for w in wanted):
                            break
                        if time.monotonic() - start > DRAWN_TIMEOUT_S:
                            raise SystemExit(f"the board did not show {wanted} within {DRAWN_TIMEOUT_S:.0f} s:\n"
                                             f"{text[-2000:]}")
                        await asyncio.sleep(0.05)
                    took = time.monotonic() - start
                    await asyncio.sleep(0.5)  # xterm.js paints on the next animation frames
                    shot = await tools.call("Page.captureScreenshot", format="png")
                    png.write_bytes(base64.b64decode(shot["data"]))
                    return took
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def browser_main(argv: list[str]) -> int:
    """``bench/tui.py --browser [PNG]``."""
    browser = chromium()
    if browser is None:
        print("no Chromium on PATH (apt-get install chromium): no screenshot of the served board")
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    png = Path(argv[0]) if argv else Path(tempfile.gettempdir()) / f"gpulayer-board-{stamp}.png"
    base_python = str(Path(sys.base_prefix) / "bin" / "python3")  # no torch to check: jobs start at once
    daemon = RealDaemon(cpu_slots=1, interpreter=base_python)
    board: subprocess.Popen[str] | None = None
    try:
        daemon.start()
        running = daemon.submit("--name", "resnet50-sweep", "--", "sleep", "300")
        daemon.wait_status(running, {"running"}, timeout_s=60.0)
        waiting = [daemon.submit("--name", name, "--", "true") for name in ("llm-finetune", "eval-ddp")]
        board, url = start_board(daemon)
        took = asyncio.run(screenshot(browser, url, [running, *waiting], png))
        print(f"served board in {Path(browser).name}: drawn {took:.2f} s after opening the page; {png}")
    finally:
        if board is not None:
            board.terminate()
            board.communicate(timeout=15)
        daemon.close()
    return 0
