#!/usr/bin/env python
"""Differential check of schedlab's `vllm` preset against vLLM 0.33's own V1 Scheduler.

    pip install -e '.[vllm]'            # vLLM 0.33.0 and torch (see the README for a CPU-only install)
    python tools/vllm_diff.py           # every feature group, 50 seeds each, shrunk reproducers
    python tools/vllm_diff.py --groups tight_kv --seeds 200 --reserve-full-prompt off
    python tools/vllm_diff.py --groups window,window_prefix,window_all,window_long   # sliding windows

The harness itself is the package schedlab.vllm_diff (importable and tested without vLLM).
"""

import sys

from schedlab.vllm_diff.cli import main

if __name__ == "__main__":
    sys.exit(main())
