"""An OpenAI-compatible completions server with a known timing model, for running the real
``vllm bench serve`` client against (tests/test_vllm_bench_replay.py, marked ``vllm``).

Standard library only. One engine thread runs continuous batching: at most ``slots`` requests
run; every step admits the requests that were waiting when it began, first come first served,
lasts ``base_ms + per_seq_ms x running + prefill_ms_per_token x prompt tokens admitted``, and
gives every running request one token (an admitted request's first). A request's prompt length
is its number of whitespace-separated words (the test's word-level tokenizer). Responses
stream server-sent events as vLLM's ``/v1/completions`` does -- one chunk per token, then a
usage chunk with vLLM's per-request ``metrics`` (queue time and time to first token), then
``[DONE]``.

The engine keeps its model's clock: a step that follows another begins at the previous one's
planned end, not at the moment the thread woke up from it, so the sleep's lateness and the
bookkeeping between steps delay when tokens leave but never add up. ``GET /steps`` returns
every step as it ran (planned start, planned length, running requests, prompt tokens admitted,
how late the thread began it) -- what a test takes as the truth.

schedlab's ``linear`` cost model with ``base_ms``, ``per_seq_ms``, ``prefill_ms_per_token``
and ``decode_ms_per_step = 0``, and ``continuous`` batching with ``max_num_seqs = slots``,
is this server. Run it in a process of its own (a test process's garbage collector stalls it
for hundreds of milliseconds):

    python tests/timing_server.py --port 8123
"""

from __future__ import annotations

import argparse
import gc
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
        #: every step: (start s, length ms, running requests, prompt tokens admitted, ms the
        #: thread began it after its start)
        self.steps: list[tuple[float, float, int, int, float]] = []

    def submit(self, job: Job) -> None:
        with self.lock:
            self.waiting.append(job)
            self.lock.notify()

    def run(self) -> None:
        end = None  # the previous step's planned end while the engine is busy
        while True:
            with self.lock:
                while not self.waiting and not self.running:
                    end = None
                    self.lock.wait()
                now = time.monotonic()
                start = now if end is None else end
                admitted = []
                while (self.waiting and self.waiting[0].queued <= start
                       and len(self.running) + len(admitted) < self.slots):
                    admitted.append(self.waiting.popleft())
            if not self.running and not admitted:  # what waits arrived after the planned start
                end = None
                continue
            for job in admitted:
                job.scheduled = start
            batch = self.running + admitted
            prompt = sum(j.prompt_tokens for j in admitted)
            step = self.base_ms + self.per_seq_ms * len(batch) + self.prefill * prompt
            end = start + step / 1e3
            self.steps.append((start, step, len(batch), prompt, (now - start) * 1e3))
            time.sleep(max(0.0, end - time.monotonic()))
            still = []
            for job in batch:
                job.generated += 1
                if job.first_token is None:
                    job.first_token = end
                done = job.generated >= job.max_tokens
                job.tokens.put(done)
                if not done:
                    still.append(job)
            self.running = still


class Handler(BaseHTTPRequestHandler):
    engine: Engine = None  # set by serve()
    #: keep-alive and chunked streams, as uvicorn serves vLLM: a client reuses its connections
    #: instead of opening one per request
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small writes leave at once (no wait for the client's delayed ACK)

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path != "/steps":
            self.send_error(404)
            return
        body = json.dumps(list(self.engine.steps)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            done = job.tokens.get()
            self._event({"id": "cmpl", "object": "text_completion", "choices": [{"index": 0, "text": " w"}]})
            if done:
                break
        self._event({"id": "cmpl", "object": "text_completion", "choices": [],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": job.generated},
                     "metrics": {"queue_time_ms": (job.scheduled - job.queued) * 1e3,
                                 "time_to_first_token_ms": (job.first_token - job.scheduled) * 1e3}})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")  # the last chunk: the connection stays open for the client's next request

    def _event(self, data: dict) -> None:
        self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    #: the listen backlog: the standard library's 5 drops a burst of connections, whose clients
    #: retry a second later (TCP's first SYN timeout); uvicorn, which vLLM runs, keeps 2048
    request_queue_size = 2048


def serve(port: int, *, slots: int = 16, base_ms: float = 5.0, per_seq_ms: float = 0.1,
          prefill_ms_per_token: float = 0.02) -> ThreadingHTTPServer:
    """Start the engine and the server on 127.0.0.1:``port`` (``serve_forever`` in a thread)."""
    engine = Engine(slots, base_ms, per_seq_ms, prefill_ms_per_token)
    engine.start()
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    server = Server(("127.0.0.1", port), handler)
    server.engine = engine
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--base-ms", type=float, default=5.0)
    parser.add_argument("--per-seq-ms", type=float, default=0.1)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.02)
    args = parser.parse_args()
    gc.freeze()  # what the process holds at start is never collected again: fewer, shorter pauses
    serve(args.port, slots=args.slots, base_ms=args.base_ms, per_seq_ms=args.per_seq_ms,
          prefill_ms_per_token=args.prefill_ms_per_token)
    print("ready", flush=True)
    threading.Event().wait()
