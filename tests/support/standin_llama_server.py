"""A stand-in for llama.cpp's `llama-server`: the command line it takes, /health, and the chat API.

Packed by tests/support/release_host.py as the `llama-server` inside a release asset (with a shebang to the
test
venv's Python), it proves the lane wiring of the `bin` and container runtimes without a C++ build. It
answers every chat with STANDIN_TEXT, streamed as chunked SSE like llama-server, and prints its argv.
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STANDIN_TEXT = "hello from the stand-in"


def _arg(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    alias = "model"

    def log_message(self, format: str, *args: object) -> None:
        print(f"standin: {format % args}", file=sys.stderr, flush=True)

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.alias, "object": "model"}]})
        elif self.path == "/props":
            self._json(200, {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize":
            self._json(200, {"tokens": list(range(len(json.dumps(body)) // 4))})
        elif self.path == "/v1/chat/completions" and body.get("stream"):
            self._stream()
        elif self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": STANDIN_TEXT}
            usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            self._json(200, {**self._head("chat.completion"), "choices": [choice], "usage": usage})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def _head(self, obj: str) -> dict[str, object]:
        return {"id": "chatcmpl-standin", "object": obj, "created": int(time.time()), "model": self.alias}

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        words = STANDIN_TEXT.split(" ")
        for i, word in enumerate(words):
            delta = {"content": word if i == 0 else f" {word}"}
            event = {**self._head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta}]}
            self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
        done = {"index": 0, "delta": {}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)}
        last = {**self._head("chat.completion.chunk"), "choices": [done], "usage": usage}
        self._chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True


def main(argv: list[str]) -> int:
    print(f"standin argv: {json.dumps(argv)}", file=sys.stderr, flush=True)
    Handler.alias = _arg(argv, "--alias", "model")
    host, port = _arg(argv, "--host", "127.0.0.1"), int(_arg(argv, "--port", "8080"))
    server = ThreadingHTTPServer((host, port), Handler)
    print(f"main: server is listening on http://{host}:{port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
