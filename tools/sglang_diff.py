#!/usr/bin/env python
"""Differential check of schedlab's `sglang` preset against SGLang 0.5.23's own scheduler.

    # a CPU install, see the README section "Checked against SGLang"
    python tools/sglang_diff.py            # every feature group, 50 seeds each, shrunk reproducers
    python tools/sglang_diff.py --groups retract --seeds 100:200

The harness itself is the package schedlab.sglang_diff (importable and tested without SGLang).
"""

import sys

from schedlab.sglang_diff.cli import main

if __name__ == "__main__":
    sys.exit(main())
