"""A local stand-in for the Hugging Face Hub (loopback only), for engine_ext/hub.py's tests.

It answers the calls huggingface_hub makes (read from its source, version 2.4: file_download.py,
hf_api.py, utils/_http.py), pointed at by HF_ENDPOINT:

    GET  /api/models/OWNER/REPO/tree/REV?recursive=...   the file list (list_repo_files)
    GET  /api/models/OWNER/REPO[/revision/REV]           repo info (sha, siblings)
    HEAD /OWNER/REPO/resolve/REV/PATH                    metadata: X-Repo-Commit, ETag (the file's
                                                          sha256, as for an LFS file), Content-Length
    GET  /OWNER/REPO/resolve/REV/PATH                    the bytes; `Range: bytes=N-` -> 206

Errors carry the headers huggingface_hub maps to its exceptions: 404 `X-Error-Code: RepoNotFound`
(unknown repository) or `EntryNotFound` (unknown file), and for a gated repository 401 (no token)
or 403 (a token without access) with `X-Error-Code: GatedRepo`. `drop_after[path] = n` makes the
first GET of that file send n bytes and close the connection (a broken download, which
huggingface_hub resumes with a range request). Every request is logged in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated_tokens: tuple[str, ...] | None = None  # None: public; else the tokens with access


@dataclass
class Logged:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    requests: list[Logged] = field(default_factory=list)
    url: str = ""

    def gets_of(self, filename: str) -> list[Logged]:
        """The GET requests of one file's bytes."""
        return [
            r for r in self.requests if r.method == "GET" and r.path.endswith(f"/resolve/main/{filename}")
        ]


def add_tree(repo: FakeRepo, root: Path) -> None:
    """Put every file under `root` into the repo, by its relative path."""
    for p in sorted(root.rglob("*")):
        if p.is_file():
            repo.files[p.relative_to(root).as_posix()] = p.read_bytes()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub

    def log_message(self, *args: Any) -> None:  # quiet
        return None

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _send(self, status: int, headers: dict[str, str], payload: bytes = b"", body: bool = True) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body and payload:
            self.wfile.write(payload)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
        if commit is not None:
            headers["X-Repo-Commit"] = commit
        self._send(status, headers, json.dumps({"error": message}).encode(), body=self.command != "HEAD")

    def _serve(self, *, body: bool) -> None:
        hub = self.hub
        path = unquote(urlsplit(self.path).path)
        hub.requests.append(Logged(self.command, path, {k.lower(): v for k, v in self.headers.items()}))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._api(parts[2] + "/" + parts[3], parts[4:])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(parts[0] + "/" + parts[1], "/".join(parts[4:]), body)
        self._error(404, "NotFound", f"no route {path}")

    def _repo(self, repo_id: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _api(self, repo_id: str, rest: list[str]) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        if rest[:1] == ["tree"]:
            listing = [
                {
                    "type": "file",
                    "oid": hashlib.sha1(data).hexdigest(),
                    "size": len(data),
                    "path": name,
                    "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
                }
                for name, data in sorted(repo.files.items())
            ]
            return self._send(200, {"Content-Type": "application/json"}, json.dumps(listing).encode())
        info = {"id": repo_id, "sha": repo.commit, "siblings": [{"rfilename": n} for n in sorted(repo.files)]}
        self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

    def _resolve(self, repo_id: str, filename: str, body: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        if repo.gated_tokens is not None:
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer "):
                return self._error(401, "GatedRepo", "Access to this model is restricted: log in")
            if auth[len("Bearer ") :] not in repo.gated_tokens:
                return self._error(403, "GatedRepo", "Access to this model is restricted: ask for access")
        data = repo.files.get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and body:
            start = int(rng[len("bytes=") :].split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        status = 206 if start else 200
        if not body:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return
        drop = self.hub.drop_after.pop(filename, None)
        if drop is not None:  # announce everything, send a part, hang up
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            self.wfile.write(data[start : start + drop])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, headers, data[start:])


class FakeHubServer:
    """FakeHub behind a ThreadingHTTPServer on 127.0.0.1 (a free port), as a context manager."""

    def __init__(self, hub: FakeHub):
        handler = type("Handler", (_Handler,), {"hub": hub})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        hub.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.hub = hub
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self.hub

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
