"""Fixes of the metrics review (/work/reviews/metrics.md) in plugins/workloads/measured.py: SGLang's
current ``bench_serving --output-details`` layout replayed as a ``vllm_bench`` workload. The files
are written here in SGLang's layout (``python/sglang/benchmark/metrics.py``, ``save_results``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from schedlab.errors import WorkloadError
from schedlab_plugins.workloads.measured import load_vllm_bench

#: a run's result as SGLang's bench_serving writes it now: its statistics at the top level, the
#: per-request lists under "details" (no latencies, no start_times)
SGLANG_DETAILS = {"backend": "sglang", "dataset_name": "random", "request_rate": "inf", "max_concurrency": None,
                  "duration": 1.0, "completed": 2, "mean_ttft_ms": 150.0, "median_ttft_ms": 150.0,
                  "mean_e2e_latency_ms": 190.0, "median_e2e_latency_ms": 190.0,
                  "details": {"input_lens": [10, 20], "output_lens": [3, 2], "ttfts": [0.1, 0.2],
                              "itls": [[0.01, 0.02], [0.03]], "generated_texts": ["a b c", "d e"],
                              "errors": ["", ""]}}


def _jsonl(path, document):
    path.write_text(json.dumps(document) + "\n", encoding="utf-8")
    return path


def test_sglangs_details_layout_is_replayed(tmp_path):
    """The lists under ``details`` are the requests: prompts 10 and 20 tokens, answers 3 and 2,
    TTFT 100 and 200 ms, and (no latencies) E2E = TTFT + the gaps: 100 + 10 + 20 = 130 and 200 +
    30 = 230 ms; TPOT (E2E - TTFT) / (tokens - 1): 15 and 30 ms."""
    bench = load_vllm_bench(_jsonl(tmp_path / "sglang.jsonl", SGLANG_DETAILS))
    assert bench.columns.prompt_tokens.tolist() == [10, 20] and bench.columns.output_tokens.tolist() == [3, 2]
    assert bench.measured.ttft_ms == pytest.approx([100.0, 200.0])
    assert bench.measured.e2e_ms == pytest.approx([130.0, 230.0])
    assert bench.measured.tpot_ms == pytest.approx([15.0, 30.0])
    assert bench.sent_ms is None and np.isinf(bench.rate)


def test_a_missing_list_names_the_flag_of_the_tool_that_wrote_the_file(tmp_path):
    """SGLang saves its lists with ``--output-details``, vLLM with ``--save-detailed``: the
    message names the one of the file's tool."""
    bare = {k: v for k, v in SGLANG_DETAILS.items() if k != "details"}
    path = _jsonl(tmp_path / "sglang.jsonl", bare)
    with pytest.raises(WorkloadError) as info:
        load_vllm_bench(path)
    assert str(info.value) == (f"{path}: missing list 'input_lens' (save the result with sglang.bench_serving "
                               f"--output-details)")
    vllm = {"backend": "vllm", "request_rate": "inf", "completed": 2, "mean_ttft_ms": 150.0, "mean_e2el_ms": 190.0}
    path = _jsonl(tmp_path / "vllm.json", vllm)
    with pytest.raises(WorkloadError) as info:
        load_vllm_bench(path)
    assert str(info.value) == f"{path}: missing list 'input_lens' (save the result with --save-detailed)"
