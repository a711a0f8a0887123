"""A loopback OpenAI-compatible chat-completions server (a test double, never product code).

An http.server on 127.0.0.1 in a thread: each POST records the request and answers with the next
scripted reply; subclasses decide what the record holds and what happens once the script runs out.
"""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackLLM:
    tokens_per_reply = 1000

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(outer.record(self, body))
                status, resp = outer.answer(self, body)
                data = json.dumps(resp).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---- hooks
    def record(self, handler, body) -> dict:
        return {"path": handler.path, "body": body}

    def exhausted(self, handler, body):
        return 200, self.completion(body, '{"answer": "out of script"}')

    def answer(self, handler, body):
        if self.replies:
            return 200, self.completion(body, self.replies.pop(0))
        return self.exhausted(handler, body)

    def completion(self, body, text) -> dict:
        n = self.tokens_per_reply
        return {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 1,
                "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": n - 100, "completion_tokens": 100, "total_tokens": n}}

    # ---- lifecycle
    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
