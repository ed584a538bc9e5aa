"""Built pages in headless Chromium, offline: the helpers of the browser tests.

A local HTTP server on 127.0.0.1 serves the built HTML and logs every request; Chromium
can reach nothing else (a dead proxy, and a host resolver that maps every other name to
nothing, so a CDN cannot be reached). After the page's scripts have run
(``--virtual-time-budget``), ``--dump-dom`` gives the DOM as the reader would see it.

A test may also have the server add a script to the page it serves (``inject``): the
script measures the laid-out page and writes what it found into an attribute of
``<body>``, which the dumped DOM carries back. Nothing else is needed: no DevTools
protocol, no Python package beyond the standard library and beautifulsoup4.

The fixtures ``chromium`` and ``book_html`` (in ``conftest.py``) give the browser (or skip,
saying why) and the built book.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bs4

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Virtual time only runs while the page is idle (MathJax's typesetting does not spend it);
# the dump comes when the budget is spent or the page has nothing left to do.
VIRTUAL_TIME_MS = 30_000
WINDOW = (1280, 2000)  # a laptop's width, in CSS pixels


def find_chromium() -> str | None:
    """Chromium's executable: ``$CHROMIUM``, or the first of CHROMIUM_NAMES on PATH."""
    return os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def fresh_existing_build() -> Path | None:
    """``_build/html`` if its last build is newer than every file git sees, else None."""
    html = ROOT / "_build" / "html"
    stamp = html / ".buildinfo"  # rewritten by every build
    if not stamp.exists() or not shutil.which("git"):
        return None
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        return None
    built = stamp.stat().st_mtime
    for name in filter(None, listed.stdout.split("\0")):
        path = ROOT / name
        if path.exists() and path.stat().st_mtime > built:
            return None
    return html


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    requests: list[tuple[str, int]]
    refused_prefix: str | None
    inject: str | None
    extra: dict[str, str]


class _Handler(SimpleHTTPRequestHandler):
    server: _Server

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if self.server.refused_prefix and path.startswith(self.server.refused_prefix):
            self.send_error(404, "refused by the test")
        elif path in self.server.extra:
            self._send_html(self.server.extra[path])
        elif self.server.inject and path.endswith(".html"):
            file = Path(self.translate_path(path))
            if not file.is_file():
                self.send_error(404)
                return
            page = file.read_text(encoding="utf-8")
            self._send_html(
                page.replace("</body>", f"<script>{self.server.inject}</script></body>", 1)
            )
        else:
            super().do_GET()

    def _send_html(self, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_request(self, code="-", size="-"):
        self.server.requests.append((self.path.split("?", 1)[0], int(code)))

    def log_message(self, format, *args):
        pass


@contextmanager
def serve(
    html: Path,
    refused_prefix: str | None = None,
    inject: str | None = None,
    extra: dict[str, str] | None = None,
):
    """Serve ``html`` on 127.0.0.1 (a free port); yield the server, whose ``requests`` log.

    ``refused_prefix``: paths answered 404; ``inject``: a script added to every HTML page;
    ``extra``: pages served from memory, by path (``/name.html``).
    """
    server = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=str(html)))
    server.requests = []
    server.refused_prefix = refused_prefix
    server.inject = inject
    server.extra = extra or {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def dump_dom(chromium: str, url: str, profile: Path) -> str:
    """The DOM of ``url`` after its scripts ran, in headless Chromium with no network."""
    command = [
        chromium,
        "--headless",
        "--no-sandbox",  # root in CI containers; these are the book's own pages
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        "--no-default-browser-check",
        "--hide-scrollbars",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={profile}",  # a fresh profile: no cache from an earlier run
        # Offline but for the test's server: loopback bypasses the (dead) proxy.
        "--proxy-server=127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--virtual-time-budget={VIRTUAL_TIME_MS}",
        "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "</html>" in result.stdout, result.stderr[-4000:]
    return result.stdout


def open_page(
    chromium: str,
    html: Path,
    page: str,
    profile: Path,
    refused_prefix: str | None = None,
    inject: str | None = None,
    extra: dict[str, str] | None = None,
) -> tuple[bs4.BeautifulSoup, list[tuple[str, int]]]:
    """``page`` (a path under ``html``, with its query) as parsed DOM, and the requests made."""
    with serve(html, refused_prefix, inject, extra) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/{page}"
        dom = dump_dom(chromium, url, profile)
    return bs4.BeautifulSoup(dom, "html.parser"), server.requests
