"""The npm registry on 127.0.0.1, for a Deno start that downloads Pyodide without the network.

:class:`MirrorRegistry` serves, as ``http://registry.npmjs.org``, the packages a warm Deno cache holds (pyodide and
its dependencies): each package's document from the cache's ``registry.json``, and for every version the cache
holds unpacked, a tarball packed from those files (with the integrity of that tarball). Deno reaches it as an HTTP
proxy (``HTTP_PROXY``) with ``NPM_CONFIG_REGISTRY=http://registry.npmjs.org/``, so what it downloads lands in the
cache under ``npm/registry.npmjs.org``, where a download from the real registry lands: a copy of that cache then
starts a sandbox with no registry at all. ``asked`` records every URL requested.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import tarfile
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

HOST = "registry.npmjs.org"


def _tarball(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname="package/" + path.relative_to(folder).as_posix(), recursive=False)
    return buffer.getvalue()


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def mirror_contents(cache_dir: Path) -> dict[str, bytes]:
    """Path -> body for every package document and cached version's tarball under ``cache_dir``."""
    root = cache_dir / "npm" / HOST
    served: dict[str, bytes] = {}
    for document_path in sorted(root.rglob("registry.json")):
        folder = document_path.parent
        name = folder.relative_to(root).as_posix()  # "ws", "@types/emscripten"
        document = json.loads(document_path.read_text(encoding="utf-8"))
        document.pop("_deno.packumentFormat", None)
        for version, meta in document.get("versions", {}).items():
            if (folder / version).is_dir():
                data = _tarball(folder / version)
                path = f"/{name}/-/{name.rsplit('/', 1)[-1]}-{version}.tgz"
                served[path] = data
                meta["dist"] = {"tarball": f"http://{HOST}{path}", "integrity": _integrity(data)}
        served[f"/{name}"] = json.dumps(document).encode()
    return served


class MirrorRegistry:
    """``with MirrorRegistry(cache_dir) as registry: env = registry.env()``; ``registry.asked`` lists requests."""

    def __init__(self, cache_dir: Path) -> None:
        self.served = mirror_contents(cache_dir)
        self.asked: list[str] = []
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._http.serve_forever, name="npm-mirror", daemon=True)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's spelling)
                url = urlsplit(self.path)  # a proxy request names the whole URL
                registry.asked.append(self.path)
                body = registry.served.get(unquote(url.path)) if url.hostname in (HOST, None) else None
                self.send_response(200 if body is not None else 404)
                body = b'{"error": "not found"}' if body is None else body
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler

    def __enter__(self) -> MirrorRegistry:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def env(self) -> dict[str, str]:
        """What Deno needs to download from this mirror as if from the public registry."""
        proxy = f"http://127.0.0.1:{self._http.server_address[1]}"
        return {"NPM_CONFIG_REGISTRY": f"http://{HOST}/", "HTTP_PROXY": proxy}
