"""An OpenAI-compatible completions server with a known timing model, for running the real
``vllm bench serve`` client against (tests/test_vllm_bench_replay.py, marked ``vllm``).

Standard library only. One engine thread runs continuous batching: at most ``slots`` requests
run; every step admits waiting requests first come first served, lasts ``base_ms +
per_seq_ms x running + prefill_ms_per_token x prompt tokens admitted``, and gives every running
request one token (an admitted request's first). A request's prompt length is its number of
whitespace-separated words (the test's word-level tokenizer). Responses stream server-sent
events as vLLM's ``/v1/completions`` does -- one chunk per token, then a usage chunk with
vLLM's per-request ``metrics`` (queue time and time to first token), then ``[DONE]``.

schedlab's ``linear`` cost model with ``base_ms``, ``per_seq_ms``, ``prefill_ms_per_token``
and ``decode_ms_per_step = 0``, and ``continuous`` batching with ``max_num_seqs = slots``,
is this server.

    python tests/timing_server.py --port 8123
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Job:
    def __init__(self, prompt_tokens: int, max_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.generated = 0
        self.tokens: queue.Queue = queue.Queue()
        self.queued = time.monotonic()
        self.scheduled = None
        self.first_token = None


class Engine(threading.Thread):
    """Continuous batching on a known clock (see the module docstring)."""

    def __init__(self, slots: int, base_ms: float, per_seq_ms: float, prefill_ms_per_token: float):
        super().__init__(daemon=True)
        self.slots, self.base_ms, self.per_seq_ms, self.prefill = slots, base_ms, per_seq_ms, prefill_ms_per_token
        self.waiting: deque = deque()
        self.running: list = []
        self.lock = threading.Condition()
        #: every step as it ran: (ms it took, running requests, prompt tokens admitted) -- a
        #: Python server under the GIL runs a little slower than its model says
        self.steps: list[tuple[float, int, int]] = []

    def submit(self, job: Job) -> None:
        with self.lock:
            self.waiting.append(job)
            self.lock.notify()

    def run(self) -> None:
        while True:
            with self.lock:
                while not self.waiting and not self.running:
                    self.lock.wait()
                admitted = []
                while self.waiting and len(self.running) + len(admitted) < self.slots:
                    admitted.append(self.waiting.popleft())
            start = time.monotonic()
            for job in admitted:
                job.scheduled = start
            batch = self.running + admitted
            step = self.base_ms + self.per_seq_ms * len(batch) + self.prefill * sum(j.prompt_tokens for j in admitted)
            time.sleep(max(0.0, start + step / 1e3 - time.monotonic()))
            now = time.monotonic()
            self.steps.append(((now - start) * 1e3, len(batch), sum(j.prompt_tokens for j in admitted)))
            still = []
            for job in batch:
                job.generated += 1
                if job.first_token is None:
                    job.first_token = now
                done = job.generated >= job.max_tokens
                job.tokens.put(done)
                if not done:
                    still.append(job)
            self.running = still


class Handler(BaseHTTPRequestHandler):
    engine: Engine = None  # set by serve()

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["prompt"]
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        job = Job(max(prompt_tokens, 1), int(body.get("max_tokens") or 16))
        self.engine.submit(job)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        while True:
            done = job.tokens.get()
            self._event({"id": "cmpl", "object": "text_completion", "choices": [{"index": 0, "text": " w"}]})
            if done:
                break
        self._event({"id": "cmpl", "object": "text_completion", "choices": [],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": job.generated},
                     "metrics": {"queue_time_ms": (job.scheduled - job.queued) * 1e3,
                                 "time_to_first_token_ms": (job.first_token - job.queued) * 1e3}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _event(self, data: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()


def serve(port: int, *, slots: int = 16, base_ms: float = 5.0, per_seq_ms: float = 0.1,
          prefill_ms_per_token: float = 0.02) -> ThreadingHTTPServer:
    """Start the engine and the server on 127.0.0.1:``port`` (``serve_forever`` in a thread)."""
    engine = Engine(slots, base_ms, per_seq_ms, prefill_ms_per_token)
    engine.start()
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.engine = engine
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    serve(args.port)
    threading.Event().wait()
