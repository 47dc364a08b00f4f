"""Check the docs site's pages in a headless browser, for what ``mkdocs build --strict`` cannot see.

    python .ci/check_pages.py                      # build the site (mkdocs build --strict), then check it
    python .ci/check_pages.py --site DIR           # check a site already built into DIR
    python .ci/check_pages.py --screenshots DIR    # also keep a screenshot of each page and of each problem

It serves the site on 127.0.0.1, loads every page in Chromium (headless, driven through the DevTools protocol
with the standard library only) at a desktop and a narrow width, and fails when a page shows:

- prose inside inline code (a stray backtick that turned the rest of a paragraph into code), or a backtick left
  in the text outside code;
- an identifier in the first column of a table broken over two lines ("max_iteratio" / "ns");
- an image that did not load;
- a link to a page of the site, or to an anchor on one, that does not exist (checked on the built files).

Needs Chromium: Debian's ``apt-get install -y chromium`` (or set ``CHROMIUM`` to any Chrome/Chromium binary).
Exit status: 0 when every page passes, 1 when a check fails, 2 when it cannot run (no Chromium, no mkdocs).
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = (1280, 760)  # a laptop screen, and a narrow window (the navigation collapses below 1220 px)
HEIGHT = 900
PROSE_WORDS = 8  # inline code holding this many plain words is prose that a stray backtick swallowed
LOAD_TIMEOUT_S = 60.0

# Runs in each page: returns the problems it sees, each {"check", "detail", "rect"} (rect: where, for a screenshot).
CHECKS_JS = r"""
(() => {
  const article = document.querySelector("article.md-content__inner") || document.body;
  const problems = [];
  const rectOf = (el) => { const r = el.getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}; };
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 3) + "..." : s);
  const plainWords = (s) => s.split(/\s+/).filter((w) => /^[A-Za-z]+[,.;:)]?$/.test(w)).length;
  for (const code of article.querySelectorAll("code")) {
    if (code.closest("pre")) continue;
    const text = code.textContent;
    if (plainWords(text) >= %(prose_words)d) {
      problems.push({check: "prose in inline code", detail: clip(text.replace(/\s+/g, " "), 120),
                     rect: rectOf(code.closest("p, li, td") || code)});
    }
  }
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.includes("`") || node.parentElement.closest("code, pre, script, style")) continue;
    problems.push({check: "backtick outside code", detail: clip(node.textContent.trim().replace(/\s+/g, " "), 120),
                   rect: rectOf(node.parentElement)});
  }
  for (const table of article.querySelectorAll("table")) {
    for (const row of table.querySelectorAll("tbody tr")) {
      const first = row.cells[0];
      if (!first) continue;
      for (const code of first.querySelectorAll("code")) {
        if (/\s/.test(code.textContent.trim())) continue;  // words may wrap between them
        if (code.getClientRects().length > 1) {
          problems.push({check: "identifier broken over lines in a table's first column",
                         detail: code.textContent, rect: rectOf(first)});
        }
      }
    }
  }
  for (const img of article.querySelectorAll("img")) {
    if (!img.complete || img.naturalWidth === 0) {
      problems.push({check: "image did not load", detail: img.getAttribute("src"), rect: rectOf(img)});
    }
  }
  return {problems, height: document.documentElement.scrollHeight, images: article.querySelectorAll("img").length};
})()
""".replace("%(prose_words)d", str(PROSE_WORDS))


# -- the site: built files, served on 127.0.0.1, and their links ---------------------------------------------------
def build_site(site: Path) -> None:
    """``mkdocs build --strict`` into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)]
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def pages(site: Path) -> list[str]:
    """The site's pages as paths under its root (``""``, ``"configuration/"``, ...), search and 404 left out."""
    found = []
    for html in sorted(site.rglob("index.html")):
        relative = html.parent.relative_to(site).as_posix()
        if relative.split("/")[0] in {"search", "assets"}:
            continue
        found.append("" if relative == "." else relative + "/")
    return found


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the checks report what matters
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` on a free port of 127.0.0.1 in a daemon thread; returns the server and its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _Links(HTMLParser):
    """The ids of a page, and the links and image sources of its content."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.add(attributes["id"])
        if attributes.get("name") and tag == "a":
            self.ids.add(attributes["name"])
        if tag == "a" and attributes.get("href"):
            self.links.append(attributes["href"])
        elif tag == "img" and attributes.get("src"):
            self.links.append(attributes["src"])


@functools.cache
def _parsed(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def broken_links(site: Path, page: str) -> list[str]:
    """Links of ``page`` to a file of the site, or to an anchor of a page, that does not exist."""
    problems = []
    here = site / page / "index.html"
    for link in sorted(set(_parsed(here).links)):
        parts = urllib.parse.urlsplit(link)
        if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
            continue  # outside the site
        target = (here.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else here
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or site.resolve() not in target.parents:
            problems.append(f"{link}: no such file in the site")
        elif parts.fragment and target.suffix == ".html" and parts.fragment not in _parsed(target).ids:
            problems.append(f"{link}: no anchor #{parts.fragment} on that page")
    return problems


# -- Chromium over the DevTools protocol (a WebSocket; the standard library only) ---------------------------------
def find_chromium() -> str | None:
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal DevTools-protocol client: one WebSocket to the browser, sessions flattened onto it."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=LOAD_TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the DevTools connection during the handshake")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"DevTools handshake refused: {status!r}")
        self.buffer = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0
        self.events: list[dict] = []

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the browser closed the DevTools connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def _send_frame(self, payload: bytes) -> None:
        header = bytes([0x81])  # FIN, text
        size = len(payload)
        if size < 126:
            header += bytes([0x80 | size])
        elif size < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", size)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", size)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _receive(self) -> dict:
        message = b""
        while True:
            first, second = self._read(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._read(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else b""
            payload = self._read(size)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("the browser closed the DevTools connection")
            if opcode in (0x9, 0xA):  # ping, pong: nothing to do for a client that only asks
                continue
            message += payload
            if first & 0x80:
                return json.loads(message)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        request = {"id": self.next_id, "method": method, "params": params}
        if session:
            request["sessionId"] = session
        self._send_frame(json.dumps(request).encode())
        while True:
            message = self._receive()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, session: str, timeout: float = LOAD_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(index)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout:.0f} s")
            self.events.append(self._receive())


def start_chromium(binary: str, profile: Path) -> tuple[subprocess.Popen, DevTools]:
    arguments = [
        binary,
        "--headless=new",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--no-proxy-server",  # every page is on 127.0.0.1; the site needs nothing else
        "--hide-scrollbars",
        "about:blank",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        arguments.insert(1, "--no-sandbox")  # Chromium refuses its sandbox to root (containers, CI)
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump():
        for line in process.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        if line.startswith("DevTools listening on "):
            return process, DevTools(line.split(" on ", 1)[1].strip())
    process.kill()
    raise RuntimeError(f"{binary} did not start its DevTools endpoint:\n{''.join(seen[-20:])}")


def stop_chromium(process: subprocess.Popen, devtools: DevTools) -> None:
    """Close the browser (its helper processes too, before its profile directory is removed), else kill it."""
    try:
        devtools.call("Browser.close")
    except (OSError, RuntimeError):  # ConnectionError is an OSError: it closed while answering
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# -- one page -------------------------------------------------------------------------------------------------------
def screenshot(devtools: DevTools, session: str, path: Path, rect: dict | None, width: int) -> None:
    if rect is None:
        clip = {"x": 0, "y": 0, "width": width, "height": HEIGHT, "scale": 1}
    else:
        pad = 12
        clip = {
            "x": max(0, rect["x"] - pad),
            "y": max(0, rect["y"] - pad),
            "width": min(width, rect["width"] + 2 * pad),
            "height": min(4000, rect["height"] + 2 * pad),
            "scale": 1,
        }
    shot = devtools.call("Page.captureScreenshot", session, format="png", clip=clip, captureBeyondViewport=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def check_page(devtools: DevTools, session: str, url: str, width: int) -> dict:
    devtools.call(
        "Emulation.setDeviceMetricsOverride", session, width=width, height=HEIGHT, deviceScaleFactor=1, mobile=False
    )
    devtools.events.clear()
    devtools.call("Page.navigate", session, url=url)
    devtools.wait_for("Page.loadEventFired", session)
    result = devtools.call("Runtime.evaluate", session, expression=CHECKS_JS, returnByValue=True)
    if "exceptionDetails" in result:
        raise RuntimeError(f"the checks failed on {url}: {result['exceptionDetails']}")
    return result["result"]["value"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="a site already built (default: build one with --strict)")
    parser.add_argument("--screenshots", type=Path, help="write a screenshot of each page and of each problem here")
    parser.add_argument(
        "--widths", default=",".join(map(str, WIDTHS)), help="viewport widths in px (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print("check_pages: no Chromium found: apt-get install -y chromium (or set CHROMIUM)", file=sys.stderr)
        return 2
    widths = [int(w) for w in args.widths.split(",")]
    with tempfile.TemporaryDirectory(prefix="rlmoptimizer-pages-", ignore_cleanup_errors=True) as scratch:
        site = args.site
        if site is None:
            site = Path(scratch) / "site"
            try:
                build_site(site)
            except (subprocess.CalledProcessError, FileNotFoundError) as exc:
                print(f"check_pages: mkdocs build --strict failed ({exc}); pip install -e '.[docs]'", file=sys.stderr)
                return 2
        site = site.resolve()
        if args.screenshots:
            args.screenshots.mkdir(parents=True, exist_ok=True)
        server, base = serve(site)
        process, devtools = start_chromium(binary, Path(scratch) / "profile")
        failures = 0
        checked = pages(site)
        try:
            target = devtools.call("Target.createTarget", url="about:blank")["targetId"]
            session = devtools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            devtools.call("Page.enable", session)
            for page in checked:
                problems = [("broken link", link, None, None) for link in broken_links(site, page)]
                images = 0
                for width in widths:
                    seen = check_page(devtools, session, base + page, width)
                    images = seen["images"]
                    problems += [(p["check"], p["detail"], p["rect"], width) for p in seen["problems"]]
                    if args.screenshots:
                        name = (page.strip("/").replace("/", "-") or "index") + f"-{width}"
                        screenshot(devtools, session, args.screenshots / f"{name}.png", None, width)
                        for number, (_, _, rect, at) in enumerate(problems, start=1):
                            if rect is not None and at == width:
                                screenshot(
                                    devtools, session, args.screenshots / f"{name}-problem-{number}.png", rect, width
                                )
                unique = list(dict.fromkeys((check, detail, width) for check, detail, _, width in problems))
                status = "ok" if not unique else f"{len(unique)} problem(s)"
                print(f"{'/' + page:<28} {status}" + (f" ({images} image(s))" if images else ""))
                for check, detail, width in unique:
                    print(f"    {check}" + (f" at {width} px" if width else "") + f": {detail}")
                failures += len(unique)
        finally:
            stop_chromium(process, devtools)
            server.shutdown()
    print(f"check_pages: {len(checked)} pages at {widths} px, {failures} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
