"""A stand-in for the Hugging Face Hub on 127.0.0.1 (``HF_ENDPOINT``): one repository whose
files are a local checkpoint's, answered the way the Hub answers what
``huggingface_hub.snapshot_download`` asks (the revision's info, the file tree, each file's
HEAD and GET under ``resolve/``); any other repository is not found (401 ``RepoNotFound``, as
the Hub answers for a repository it does not show). It counts the files served."""

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves ``folder``'s files as repository ``repo_id`` at revision `COMMIT`."""

    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id = repo_id
        self.files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        self.served: Counter[str] = Counter()  # file name -> GETs of its content

    def answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request."""
        info = f"/api/models/{self.repo_id}/revision/"
        tree = f"/api/models/{self.repo_id}/tree/"
        resolve = f"/{self.repo_id}/resolve/"
        if path.startswith(info):
            siblings = [{"rfilename": name} for name in self.files]
            return _json({"id": self.repo_id, "sha": COMMIT, "siblings": siblings})
        if path.startswith(tree):
            entries = [
                {"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                for name, data in self.files.items()
            ]
            return _json(entries)
        if path.startswith(resolve):
            name = path.removeprefix(resolve).partition("/")[2]
            if name not in self.files:
                return 404, {"X-Error-Code": "EntryNotFound"}, b""
            data = self.files[name]
            headers = {
                "X-Repo-Commit": COMMIT,
                "ETag": f'"{_oid(data)}"',
                "Content-Length": str(len(data)),
            }
            if method == "GET":
                self.served[name] += 1
            return 200, headers, data if method == "GET" else b""
        return 401, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}'


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _json(value: object) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()


@contextmanager
def serving(hub: FakeHub) -> Iterator[str]:
    """The hub served on a free port of 127.0.0.1; yields its URL (for ``HF_ENDPOINT``)."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            status, headers, body = hub.answer(self.command, unquote(urlsplit(self.path).path))
            self.send_response(status)
            headers.setdefault("Content-Length", str(len(body)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

        do_GET = do_HEAD = _reply

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
