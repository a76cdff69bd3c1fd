"""A tiny Hugging Face Hub on 127.0.0.1 for download tests: the endpoints huggingface_hub 2.4 uses
to list and fetch a model repository (`/api/models/{repo}/revision/{rev}?blobs=True`,
`/{repo}/resolve/{rev}/{file}` with HEAD, GET and Range), its error headers (X-Error-Code:
RepoNotFound / GatedRepo), and faults to inject (a connection closed or reset after n bytes, a
body shorter or different than listed, a Range ignored as some proxies do). Serves from memory;
records every request; stops itself after `lifetime` seconds whatever happens."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_FROM = 1024  # files this large are listed as LFS (sha256), smaller ones by git blob hash


class FakeHub:
    def __init__(self, lifetime: float = 120.0):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: set[str] = set()
        self.cut: dict[
            tuple[str, str], int
        ] = {}  # (repo, file) -> bytes sent before the connection drops
        self.reset: set[tuple[str, str]] = set()  # (repo, file) whose cut is a reset (RST)
        self.served: dict[
            tuple[str, str], bytes
        ] = {}  # (repo, file) -> body served instead of the listed one
        self.no_ranges: set[tuple[str, str]] = set()  # (repo, file) whose Range is ignored (200)
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._handle(self, head=False)

            def do_HEAD(self):
                hub._handle(self, head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.timer = threading.Timer(lifetime, self.stop)
        self.timer.daemon = True

    def __enter__(self):
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos[repo] = dict(files)

    def gets(self, repo: str, name: str) -> list[str | None]:
        """The Range header of every GET of one file (None: the whole file)."""
        return [
            r for m, p, r in self.requests if m == "GET" and p == f"/{repo}/resolve/{COMMIT}/{name}"
        ]

    # --- protocol ---------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(h, m.group(1))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._file(h, m.group(1), m.group(3), head)
        self._error(h, 404, "EntryNotFound", "no such endpoint")

    def _error(self, h, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _info(self, h, repo: str) -> None:
        if repo not in self.repos:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        siblings = []
        for name, data in sorted(self.repos[repo].items()):
            s = {"rfilename": name, "size": len(data)}
            if len(data) >= LFS_FROM:
                s["lfs"] = {
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
                s["blobId"] = hashlib.sha1(b"pointer" + data).hexdigest()
            else:
                s["blobId"] = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
            siblings.append(s)
        body = json.dumps(
            {
                "id": repo,
                "modelId": repo,
                "sha": COMMIT,
                "private": False,
                "gated": "manual" if repo in self.gated else False,
                "siblings": siblings,
            }
        ).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _file(self, h, repo: str, name: str, head: bool) -> None:
        if repo not in self.repos:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        if repo in self.gated:
            return self._error(
                h,
                403,
                "GatedRepo",
                f"Access to model {repo} is restricted and you are not in the authorized list",
            )
        if name not in self.repos[repo]:
            return self._error(h, 404, "EntryNotFound", "Entry not found")
        listed = self.repos[repo][name]
        data = self.served.get((repo, name), listed)
        start, status = 0, 200
        rng = None if (repo, name) in self.no_ranges else h.headers.get("Range")
        if rng:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            status = 206
        body = data[start:]
        h.send_response(status)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{hashlib.sha256(listed).hexdigest()}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(body)))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        cut = self.cut.pop((repo, name), None)
        if cut is not None:
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            if (repo, name) not in self.reset:
                h.connection.shutdown(2)  # the connection drops mid-file: an early end
                return
            time.sleep(0.2)  # the client reads what was sent, then ECONNRESET
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
            return
        h.wfile.write(body)
