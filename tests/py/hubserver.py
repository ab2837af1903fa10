"""A small stand-in for the Hugging Face hub on 127.0.0.1, for tests/py/test_pull.py.

It answers the requests huggingface_hub (and `dspark pull`) make, the way the hub does:
  GET  /api/models/{org}/{name}/revision/{rev}[?blobs=true]
        {"id", "sha": commit, "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}
  HEAD|GET /{org}/{name}/resolve/{rev}/{path}
        an LFS file (*.safetensors): 302 to an absolute /cdn/{sha256} URL with X-Repo-Commit,
        X-Linked-Etag: "<sha256>", X-Linked-Size; any other file: 200 with X-Repo-Commit,
        ETag: "<git blob id>" and the bytes (Range honoured)
  GET  /cdn/{sha256}   the bytes of an LFS file (Range honoured), on a second port: another origin,
                       as the hub's CDN is another host
A private repo answers 401 without "Authorization: Bearer <token>"; unknown repos, revisions and
files answer 404; a renamed repo answers 307 with a relative Location. Faults for the tests: drop
the connection after N bytes of a file (once or always), flip a byte of it, 404 it, answer 503
first. Every request
is logged (method, path, Range, whether a token came). Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, files: dict[str, bytes], commit: str, refs: dict[str, str] | None = None, private: bool = False):
        self.files, self.commit, self.private = files, commit, private
        self.refs = refs if refs is not None else {"main": commit}

    def resolve(self, rev: str) -> str | None:
        """the commit of a branch, a tag or a commit id"""
        return self.refs.get(rev, rev if rev == self.commit or rev in self.refs.values() else None)

    def is_lfs(self, path: str) -> bool:
        return path.endswith(".safetensors")


class Hub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.renamed: dict[str, str] = {}     # old id -> new id
        self.token = "hf_test_secret"
        self.faults: dict[str, dict] = {}     # path in repo -> {"drop_after": n, "times": k, "corrupt": True, "missing": True}
        self.log: list[dict] = []
        self.lock = threading.Lock()
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler()) for _ in range(2)]
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)
        for s in self.servers:
            s.daemon_threads = True
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def close(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()

    def requests(self, method=None, prefix=""):
        with self.lock:
            return [r for r in self.log if (method is None or r["method"] == method) and r["path"].startswith(prefix)]

    def _handler(hub):  # noqa: N805 (the handler class closes over the hub)
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.route(head=True)

            def do_GET(self):
                self.route(head=False)

            # ---- replies
            def reply(self, status, body=b"", headers=(), head=False):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def error(self, status, msg, head=False):
                self.reply(status, json.dumps({"error": msg}).encode(), [("Content-Type", "application/json"), ("X-Error-Message", msg)], head)

            def send_bytes(self, data: bytes, fault_key: str, extra=(), head=False):
                """data with Range, and the faults registered for fault_key"""
                f = hub.faults.get(fault_key, {})
                if f.get("status_times", 0) > 0:  # a transient server error, then the bytes
                    with hub.lock:
                        f["status_times"] -= 1
                    return self.error(f["status"], "try again", head)
                if f.get("corrupt") and data:
                    data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
                start, end, status = 0, len(data), 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, b = rng[6:].partition("-")
                    start = int(a)
                    end = int(b) + 1 if b else len(data)
                    if start >= len(data):
                        self.reply(416, b"", [("Content-Range", f"bytes */{len(data)}")] + list(extra), head)
                        return
                    status = 206
                body = data[start:end]
                self.send_response(status)
                for k, v in extra:
                    self.send_header(k, v)
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if head:
                    return
                drop = f.get("drop_after")
                if drop is not None and f.get("times", 1) > 0:
                    with hub.lock:
                        f["times"] = f.get("times", 1) - 1
                    self.wfile.write(body[:drop])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

            # ---- routes
            def route(self, head):
                u = urlsplit(self.path)
                path = unquote(u.path)
                auth = self.headers.get("Authorization")
                with hub.lock:
                    hub.log.append({"method": self.command, "path": path, "query": u.query, "range": self.headers.get("Range"),
                                    "auth": auth})
                parts = path.strip("/").split("/")
                if path.startswith("/cdn/"):
                    for repo in hub.repos.values():
                        for name, data in repo.files.items():
                            if hashlib.sha256(data).hexdigest() == parts[1]:
                                return self.send_bytes(data, name, head=head)
                    return self.error(404, "Entry not found", head)
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                    repo_id, rev = "/".join(parts[2:4]), "/".join(parts[5:])
                    repo = self.repo_for(repo_id, auth, head)
                    if repo is None:
                        return
                    commit = repo.resolve(rev)
                    if commit is None:
                        return self.error(404, f"Invalid rev id: {rev}", head)
                    sib = []
                    for name, data in repo.files.items():
                        s = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
                        if repo.is_lfs(name):
                            s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                        sib.append(s)
                    return self.reply(200, json.dumps({"id": repo_id, "sha": commit, "siblings": sib}).encode(),
                                      [("Content-Type", "application/json")], head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo_id, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    if repo_id in hub.renamed:  # a relative redirect, as the hub does for renamed repos
                        new = hub.renamed[repo_id]
                        return self.reply(307, b"", [("Location", f"/{new}/resolve/{quote(rev, safe='')}/{quote(name)}")], head)
                    repo = self.repo_for(repo_id, auth, head)
                    if repo is None:
                        return
                    commit = repo.resolve(rev)
                    if commit is None:
                        return self.error(404, "Revision Not Found", head)
                    data = repo.files.get(name)
                    if data is None or hub.faults.get(name, {}).get("missing"):
                        return self.reply(404, b"Entry not found", [("X-Error-Code", "EntryNotFound"), ("X-Repo-Commit", commit)], head)
                    if repo.is_lfs(name):
                        sha = hashlib.sha256(data).hexdigest()
                        return self.reply(302, b"", [("Location", f"{hub.cdn_url}/cdn/{sha}"), ("X-Repo-Commit", commit),
                                                     ("X-Linked-Etag", f'"{sha}"'), ("X-Linked-Size", str(len(data))),
                                                     ("ETag", '"0000pointer-etag"')], head)
                    return self.send_bytes(data, name, [("X-Repo-Commit", commit), ("ETag", f'"{git_blob_id(data)}"')], head)
                return self.error(404, "not found", head)

            def repo_for(self, repo_id, auth, head):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self.error(404, "Repository not found", head)
                    return None
                if repo.private and auth != f"Bearer {hub.token}":
                    self.error(401, "Invalid credentials in Authorization header" if auth else "Access to this repo is restricted", head)
                    return None
                return repo

        return Handler
