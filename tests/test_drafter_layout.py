"""The drafter runs on the target's GPUs, as vLLM runs it (the speculative review): its cost model
takes the target's ``gpu`` and ``tensor_parallel`` where its table leaves them out
(``_verify_and_get_draft_tp``: the draft's TP defaults to the target's); another GPU, or a TP vLLM
refuses, is refused. A target at TP 2 timed its drafter at TP 1: TPOT 15% slow."""

from __future__ import annotations

import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load, run_experiment

RUN = """
[workload]
kind = "synthetic"
num_requests = 20
rate = 5.0
prompt = {{dist = "uniform", low = 20, high = 200}}
output = {{dist = "uniform", low = 20, high = 200}}
[scheduler]
kind = "vllm"
[cost_model]
kind = "roofline"
model = "llama-3-8b"
gpu = "a100-80gb"
tensor_parallel = 2
[kv_cache]
kind = "paged"
model = "llama-3-8b"
gpu = "a100-80gb"
tensor_parallel = 2
[speculative]
method = "{method}"
num_speculative_tokens = 3
acceptance_rate = 0.8
draft = {{kind = "roofline", model = "llama-3.2-1b"{extra}}}
"""


def tpot(tmp_path, extra="", method="draft_model"):
    path = tmp_path / "spec.toml"
    path.write_text(RUN.format(extra=extra, method=method))
    return run_experiment(load(path)).all_runs()[0].metrics["tpot_ms"]["mean"]


def test_the_drafter_takes_the_targets_gpu_and_tensor_parallel(tmp_path):
    assert tpot(tmp_path) == tpot(tmp_path, ', gpu = "a100-80gb", tensor_parallel = 2')
    # an EAGLE head may run at TP 1 (vLLM allows 1 or the target's): slower than at the target's 2
    assert tpot(tmp_path, method="eagle") < tpot(tmp_path, ", tensor_parallel = 1", method="eagle")


@pytest.mark.parametrize("extra, method, said", [
    (', gpu = "h100-80gb"', "draft_model", "gpu = 'h100-80gb', but the target runs on 'a100-80gb'"),
    (", tensor_parallel = 4", "eagle", "tensor_parallel = 4: vLLM runs a eagle's drafter at 1 or 2"),
    (", tensor_parallel = 1", "draft_model", "tensor_parallel = 1: vLLM runs a draft model's drafter at 2"),
])
def test_a_drafter_vllm_would_not_run_is_refused(tmp_path, extra, method, said):
    with pytest.raises(ConfigError, match=r"\[speculative.draft\]: " + said.replace("(", r"\(").replace(")", r"\)")):
        tpot(tmp_path, extra, method)


SGLANG = """
[workload]
kind = "synthetic"
num_requests = 120
arrival = "all-at-once"
prompt = {{dist = "fixed", value = 50}}
output = {{dist = "fixed", value = 100}}
[scheduler]
kind = "sglang"
{scheduler}
[cost_model]
kind = "linear"
[speculative]
method = "eagle"
num_speculative_tokens = 3
acceptance_rate = 0.7
draft = {{kind = "linear"}}
"""


def test_sglang_with_eagle_runs_48_requests_and_no_mixed_chunks_as_sglang_does(tmp_path):
    """SGLang's server_args with EAGLE or a draft model: max_running_requests 48 where unset, mixed
    chunks off (it ran 120 at once, and verify passes shared batches with prefill chunks)."""
    path = tmp_path / "sglang.toml"
    path.write_text(SGLANG.format(scheduler=""))
    assert run_experiment(load(path)).all_runs()[0].metrics["peak_running"] == 48
    path.write_text(SGLANG.format(scheduler="max_running_requests = 64"))
    assert run_experiment(load(path)).all_runs()[0].metrics["peak_running"] == 64
    path.write_text(SGLANG.format(scheduler="enable_mixed_chunk = true"))
    with pytest.raises(ConfigError, match="SGLang turns mixed chunks off with EAGLE and draft-model speculation"):
        load(path)


def test_a_drafter_that_does_not_fit_is_named_and_the_tp_suggested_holds_both():
    """The message named the target alone and suggested TP 2, where the target and a 70B drafter
    (146.4 GiB together; 73.2 GiB a rank at TP 2, more than an A100-80GB's 72 usable) still do not fit."""
    from schedlab.capacity import Presets, size_kv_cache
    from schedlab.catalog import load_catalog

    presets = Presets.from_catalog(load_catalog(entry_points=False))
    with pytest.raises(ConfigError, match=r"of weights \(the drafter llama-3-70b's among them\).*use tensor_parallel = 4"):
        size_kv_cache(presets.model("llama-3-8b"), presets.gpu("a100-80gb"), draft=presets.model("llama-3-70b"))


def test_a_draft_model_of_another_vocabulary_is_refused(tmp_path):
    path = tmp_path / "vocab.toml"
    path.write_text(RUN.format(extra="", method="draft_model").replace('model = "llama-3.2-1b"', 'model = "tiny"')
                    + "[models.tiny]\nnum_layers = 4\nnum_kv_heads = 4\nhead_dim = 64\nnum_attention_heads = 8\n"
                      "hidden_size = 512\nnum_params = 5e7\nvocab_size = 32000\n")
    with pytest.raises(ConfigError, match=r"the draft model's vocabulary \(32,000 tokens\) is not the target's "
                                          r"\(128,256\)"):
        run_experiment(load(path))


def test_the_drafters_gpu_is_compared_as_the_presets_name_it(tmp_path):
    """"A100-80GB" is the target's "a100-80gb": it was refused as another GPU."""
    assert tpot(tmp_path, ', gpu = "A100-80GB"') == tpot(tmp_path)
