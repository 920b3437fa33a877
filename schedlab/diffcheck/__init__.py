"""Differential checking of schedlab's presets against real engines' own scheduler code.

What the vLLM harness (:mod:`schedlab.vllm_diff`) and the SGLang harness
(:mod:`schedlab.sglang_diff`) share; none of it imports an engine:

* :mod:`.case` -- a case (settings, requests), one-sided settings, the reproducer text;
* :mod:`.tokens` -- token ids of a request and the block hashes schedlab gets for them;
* :mod:`.workloads` -- random requests (arrivals, lengths, shared prefixes, EOS limits);
* :mod:`.schedlab_side` -- run a case on schedlab's fast or reference engine at 1 ms per iteration;
* :mod:`.compare` -- per-request differences and the agreement table;
* :mod:`.shrink` -- delta debugging of a differing case down to a minimal reproducer;
* :mod:`.cli` -- the command line of ``tools/vllm_diff.py`` and ``tools/sglang_diff.py``.
"""
