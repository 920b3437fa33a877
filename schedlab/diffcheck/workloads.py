"""Random requests for differential cases, shared by the vLLM and SGLang harnesses.

A harness seeds one ``random.Random(f"{group}:{seed}")`` per case and draws its settings and
its requests from it, so a case depends only on ``(group, seed)``.
"""

from __future__ import annotations

import random

from .case import DiffRequest


def random_requests(rng: random.Random, *, priorities: bool = False, prefixes: bool = False, block_size: int = 1,
                    eos: bool = False, limited: bool = False, most: int = 8, longest_prompt: int = 120,
                    longest_output: int = 30) -> list[DiffRequest]:
    """1 to ``most`` requests arriving over 0, 5, 20 or 40 iterations, ids in arrival order.

    :param priorities: priorities 0-3 (else all 0).
    :param prefixes: most requests share a prompt prefix with others of one of 1-3 groups: the
        whole shared prompt (maybe plus a question of their own), some whole blocks of it, or
        any number of its tokens.
    :param eos: about half the requests have a ``max_tokens`` above their output (they stop at
        an EOS the engine cannot foresee); the others ignore EOS.
    :param limited: every request has a ``max_tokens`` and reaches it (an engine that estimates
        early EOS underestimates them all).
    """
    n = rng.randint(1, most)
    horizon = rng.choice([0, 5, 20, 40])
    groups = rng.randint(1, 3)
    drafts = []
    for _ in range(n):
        prompt = rng.randint(1, longest_prompt)
        output = rng.randint(1, longest_output)
        group, prefix_len = None, 0
        if prefixes and rng.random() < 0.8:
            group = rng.randrange(groups)
            if rng.random() < 0.5:  # the whole shared prompt, maybe plus its own question
                prefix_len = prompt
                prompt += rng.choice([0, 0, rng.randint(1, 40)])
            else:  # a shared prefix of some whole blocks, or anywhere
                prefix_len = min(prompt, block_size * rng.randint(0, 6)) if rng.random() < 0.5 else rng.randint(0, prompt)
            if not prefix_len:
                group = None
        limit = output if limited else None
        if eos and rng.random() < 0.5:
            limit = output + rng.choice([0, rng.randint(1, 10), rng.randint(1, 4 * longest_output)])
        drafts.append((rng.randint(0, horizon), prompt, output, rng.randint(0, 3) if priorities else 0,
                       group, prefix_len, limit))
    drafts.sort(key=lambda d: d[0])  # ids in arrival order
    return [DiffRequest(id=i, arrival=a, prompt_tokens=p, output_tokens=o, priority=pr, group=g, prefix_len=pl,
                        max_tokens=m)
            for i, (a, p, o, pr, g, pl, m) in enumerate(drafts)]
