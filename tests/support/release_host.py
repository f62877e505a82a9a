"""A local stand-in for GitHub's releases API and its asset downloads, in the upstream layout.

`GET /repos/{owner}/{repo}/releases/tags/{tag}` and `/releases/latest` list assets with their
`browser_download_url` and `digest` ("sha256:..."), as GitHub does; the URLs point back here. An asset can
be published with a digest that does not match its bytes (a tampered file), or with none. Runs in a thread,
since the fetcher under test is synchronous.

Assets: llama.cpp's (`zip_asset`, `tar_asset`: the stand-in llama-server in
tests/support/standin_llama_server.py)
and stable-diffusion.cpp's (`sd_zip_asset`: a stand-in sd-server, SD_STANDIN below, that answers what the
sd.cpp lane and the images route need: `--version`, `GET /v1/models`, `POST /v1/images/generations` with
real PNGs of the size asked for).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

STANDIN = Path(__file__).with_name("standin_llama_server.py")


def standin_script() -> bytes:
    """The stand-in llama-server as an executable script for this test venv's Python."""
    return f"#!{sys.executable}\n".encode() + STANDIN.read_bytes()


def zip_asset(
    binary: str = "llama-server", *, inner: str = "build/bin", script: bytes | None = None
) -> bytes:
    """A release zip as upstream packs it: the binary (mode 0755) and a library beside it."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo(f"{inner}/{binary}")
        info.external_attr = 0o100755 << 16
        zf.writestr(info, script if script is not None else standin_script())
        zf.writestr(f"{inner}/libggml-base.so", b"\x7fELF not really")
    return buf.getvalue()


# The stand-in sd-server: sd-server's flags (--listen-ip, --listen-port), its version line, its readiness
# route and its images route in OpenAI's shape, one solid-colour PNG per image (colour from the prompt).
SD_STANDIN = """
import base64, hashlib, json, struct, sys, time, zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SD_VERSION = "stable-diffusion.cpp version standin-1, commit 0000000"


def png(width, height, rgb):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    row = b"\\x00" + bytes(rgb) * width
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = zlib.compress(row * height)
    return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        print("sd standin: " + format % args, file=sys.stderr, flush=True)

    def answer(self, status, doc):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.answer(200, {"object": "list", "data": [{"id": "sd-cpp-local", "object": "model"}]})
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/v1/images/generations":
            return self.answer(404, {"error": "not found"})
        prompt = str(body.get("prompt") or "").split(" <sd_cpp_extra_args>")[0]
        if not prompt:
            return self.answer(400, {"error": "prompt is required"})
        width, height = (int(x) for x in str(body.get("size") or "512x512").split("x"))
        rgb = hashlib.sha256(prompt.encode()).digest()[:3]
        images = [{"b64_json": base64.b64encode(png(width, height, rgb)).decode()}]
        self.answer(200, {"created": int(time.time()), "data": images * int(body.get("n") or 1),
                          "output_format": "png"})


def main(argv):
    if "--version" in argv:
        print(SD_VERSION)
        return 0
    print("sd standin argv: " + json.dumps(argv), file=sys.stderr, flush=True)
    host = argv[argv.index("--listen-ip") + 1]
    port = int(argv[argv.index("--listen-port") + 1])
    ThreadingHTTPServer((host, port), Handler).serve_forever()
    return 0


raise SystemExit(main(sys.argv[1:]))
"""


def sd_standin_script() -> bytes:
    return f"#!{sys.executable}\n{SD_STANDIN}".encode()


def sd_zip_asset(*, script: bytes | None = None) -> bytes:
    """A stable-diffusion.cpp release zip as upstream packs it: the programs at the top, a library beside."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in ("sd-server", "sd-cli"):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100755 << 16
            zf.writestr(info, script if script is not None else sd_standin_script())
        zf.writestr("libstable-diffusion.so", b"\x7fELF not really")
    return buf.getvalue()


def tar_asset(binary: str = "llama-server", *, top: str = "llama-b1") -> bytes:
    """A release tarball with a versioned top folder."""
    buf = io.BytesIO()
    data = standin_script()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo(f"{top}/{binary}")
        info.size, info.mode = len(data), 0o755
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Asset:
    name: str
    data: bytes
    digest: str | None  # what the API publishes; None: no digest field


@dataclass
class ReleaseHost:
    """Releases by (repo, tag); `latest` per repo; every request path is recorded in `hits`."""

    releases: dict[tuple[str, str], list[Asset]] = field(default_factory=dict)
    latest: dict[str, str] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def publish(
        self,
        repo: str,
        tag: str,
        name: str,
        data: bytes,
        *,
        digest: str | None = "auto",
        latest: bool = False,
    ) -> str:
        """Add an asset; its real sha256 is published unless `digest` says otherwise. Returns the sha256."""
        real = hashlib.sha256(data).hexdigest()
        shown = f"sha256:{real}" if digest == "auto" else digest
        self.releases.setdefault((repo, tag), []).append(Asset(name, data, shown))
        if latest:
            self.latest[repo] = tag
        return real

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _listing(self, repo: str, tag: str) -> dict[str, object] | None:
        assets = self.releases.get((repo, tag))
        if assets is None:
            return None
        listed = []
        for a in assets:
            entry: dict[str, object] = {
                "name": a.name,
                "size": len(a.data),
                "browser_download_url": f"{self.url}/{repo}/releases/download/{tag}/{a.name}",
            }
            if a.digest is not None:
                entry["digest"] = a.digest
            listed.append(entry)
        return {"tag_name": tag, "assets": listed}

    def _answer(self, path: str) -> tuple[int, bytes, str]:
        self.hits.append(path)
        parts = path.strip("/").split("/")
        if parts[:1] == ["repos"] and len(parts) >= 5 and parts[3] == "releases":
            repo = f"{parts[1]}/{parts[2]}"
            tag = self.latest.get(repo, "") if parts[4] == "latest" else "/".join(parts[5:])
            listing = self._listing(repo, tag)
            if listing is not None:
                return 200, json.dumps(listing).encode(), "application/json"
        if len(parts) >= 6 and parts[2:4] == ["releases", "download"]:
            for a in self.releases.get((f"{parts[0]}/{parts[1]}", parts[4]), []):
                if a.name == parts[5]:
                    return 200, a.data, "application/octet-stream"
        return 404, b'{"message": "Not Found"}', "application/json"

    def __enter__(self) -> ReleaseHost:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                status, body, ctype = host._answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
