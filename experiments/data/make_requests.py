"""Regenerate requests.json: the seed lab's 100 requests (prompt_tokens, output_tokens).

Output lengths are log-uniform between 10 and 1000 tokens (most answers short, a few long --
what makes static batching wasteful); prompts log-uniform between 16 and 1024 tokens.
Run: python experiments/data/make_requests.py  (deterministic: seed 1).
"""

import json
from pathlib import Path

import numpy as np

rng = np.random.default_rng(1)
n = 100
outputs = np.exp(rng.uniform(np.log(10), np.log(1000), n)).round().astype(int)
prompts = np.exp(rng.uniform(np.log(16), np.log(1024), n)).round().astype(int)
outputs[0], outputs[1] = 10, 1000  # the seed's stated range, end to end
requests = [{"prompt_tokens": int(p), "output_tokens": int(o)} for p, o in zip(prompts, outputs)]
Path(__file__).with_name("requests.json").write_text(json.dumps({"requests": requests}, indent=1) + "\n")
