"""What an SGLang / TGI operator's run gets without saying: the host-overlap timing each engine
really has, warnings where two tables disagree on the layout, and a search answer's caveats."""

from __future__ import annotations

import re
import warnings

import pytest

from schedlab.errors import InputWarning
from schedlab.study.experiment import load, run_experiment
from schedlab.study.simulation import tensor_parallel

BASE = """
[experiment]
name = "x"
reports = []
timeline = false

[workload]
kind = "synthetic"
num_requests = 40
rate = 20.0
prompt = {{dist = "fixed", value = 200}}
output = {{dist = "fixed", value = 30}}

[cost_model]
kind = "roofline"
model = "llama-3.1-8b"
gpu = "h100-80gb"
{cost}

[kv_cache]
kind = "paged"
model = "llama-3.1-8b"
gpu = "h100-80gb"
{kv}

[scheduler]
{scheduler}
"""


def _run(tmp_path, scheduler, cost="", kv="", extra=""):
    path = tmp_path / "exp.toml"
    path.write_text(BASE.format(scheduler=scheduler, cost=cost, kv=kv) + extra)
    return run_experiment(load(path))


def _built_cost(tmp_path, scheduler, cost=""):
    """The run's cost model as built (its config) from the experiment's tables."""
    from schedlab.study.simulation import assemble

    path = tmp_path / "exp.toml"
    path.write_text(BASE.format(scheduler=scheduler, cost=cost, kv=""))
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x").instances[0][1]


@pytest.mark.parametrize("scheduler, cost, overlaps", [
    ('kind = "tgi"', "", False),                              # TGI steps synchronously
    ('kind = "tgi"', "async_scheduling = true", True),        # a given value wins
    ('kind = "sglang"', "", True),                            # SGLang's overlap scheduler, on by default
    ('kind = "sglang"\noverlap_schedule = false', "", False),  # without it, the host's work is between steps
    ('kind = "sglang"\noverlap_schedule = false', "async_scheduling = true", True),
    ('kind = "vllm"', "", True),                              # vLLM 0.33's default
    ('kind = "continuous"', "", True),                        # the cost model's own default
])
def test_the_cost_models_host_overlap_follows_the_engine(tmp_path, scheduler, cost, overlaps):
    assert _built_cost(tmp_path, scheduler, cost).config.async_scheduling is overlaps


def test_tgi_steps_are_slower_without_the_overlap_it_never_had(tmp_path):
    """The same TGI run with the host's work overlapped (the old default) decodes faster: the
    default now charges it between steps, as TGI's router waits for each step's answer."""
    sync = _run(tmp_path, 'kind = "tgi"').all_runs()[0].metrics["tpot_ms"]["p50"]
    overlapped = _run(tmp_path, 'kind = "tgi"', cost="async_scheduling = true").all_runs()[0].metrics
    assert overlapped["tpot_ms"]["p50"] < sync


def test_a_cost_model_and_a_cache_split_over_different_ranks_are_warned_about(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(BASE.format(scheduler='kind = "vllm"', cost="tensor_parallel = 2", kv=""))
    with pytest.warns(InputWarning, match=r"\[kv_cache\] tensor_parallel = 1 but \[cost_model\] tensor_parallel = 2: "
                                          r"the pool is sized for one layout"):
        load(path)
    path.write_text(BASE.format(scheduler='kind = "vllm"', cost="tensor_parallel = 2", kv="tensor_parallel = 2"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        load(path)
    # a measured block count is not sized from the layout: nothing to say
    path.write_text(BASE.format(scheduler='kind = "vllm"', cost="tensor_parallel = 2", kv="num_blocks = 500"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        load(path)


def test_an_instance_runs_on_the_larger_of_the_two_layouts():
    class Config:
        tensor_parallel = 2

    class Cost:
        config = Config()

    class Sizing:
        tensor_parallel = 1

    class Cache:
        sizing = Sizing()

    assert tensor_parallel(Cost(), Cache()) == 2
    Sizing.tensor_parallel = 4
    assert tensor_parallel(Cost(), Cache()) == 4
    assert tensor_parallel(None, object()) == 1


SEARCH = """
[search]
key = "workload.rate"
low = 1
high = 4
constraint = "ttft_ms.p99 <= 1e9"
"""


def test_a_search_answer_says_when_its_run_turned_requests_away(tmp_path):
    """Prompts of 200-2,000 tokens against max_model_len 1,000: about half are rejected at every
    rate, so the percentiles the constraint reads cover the others only."""
    path = tmp_path / "exp.toml"
    text = BASE.format(scheduler='kind = "continuous"\nmax_model_len = 1000', cost="", kv="")
    text = text.replace('prompt = {dist = "fixed", value = 200}', 'prompt = {dist = "uniform", low = 200, high = 2000}')
    path.write_text(text + SEARCH)
    study = run_experiment(load(path)).studies[0]
    answer = next(r for r in study.runs if r.name.endswith("=4]") or r.name.endswith("=4.0]"))
    assert 5 < answer.metrics["rejected"] < 35
    assert study.search.message == (
        "ttft_ms.p99 <= 1e9 holds up to the top of the range (workload.rate = 4); raise high to search further; "
        f"at the answer {answer.metrics['rejected']} of 40 requests were rejected (percentiles count finished "
        'ones: add "rejected <= 0" to count them)')
    # a constraint that counts them: nothing to add
    path.write_text(text + SEARCH.replace('constraint = "ttft_ms.p99 <= 1e9"',
                                          'constraints = ["ttft_ms.p99 <= 1e9", "rejected <= 40"]'))
    assert "at the answer" not in run_experiment(load(path)).studies[0].search.message


def test_a_search_answer_says_when_its_run_held_most_requests_at_once(tmp_path):
    """40 requests of 2,000 output tokens at 4 a second: the first is still running when the
    last arrives 10 s later, so (nearly) every request is in the batch at once."""
    path = tmp_path / "exp.toml"
    text = BASE.format(scheduler='kind = "vllm"', cost="", kv="")
    text = text.replace('output = {dist = "fixed", value = 30}', 'output = {dist = "fixed", value = 2000}')
    path.write_text(text + SEARCH)
    study = run_experiment(load(path)).studies[0]
    peak = study.runs[-1].metrics["peak_running"]
    assert peak >= 20
    assert study.search.message.endswith(
        f"at the answer up to {peak} of 40 requests ran at once: the run may be too short to show an overload, "
        "which the running batch takes in (more requests, or a TPOT constraint, would)")
    # 30-token answers finish long before the next arrives: nothing to add
    path.write_text(BASE.format(scheduler='kind = "vllm"', cost="", kv="") + SEARCH)
    assert "at the answer" not in run_experiment(load(path)).studies[0].search.message


@pytest.mark.parametrize("key, where", [
    ("mem_fraction_static", "[kv_cache] num_blocks, from the max_total_num_tokens SGLang logs"),
    ("page_size", "[kv_cache] block_size"),
    ("tensor_parallel_size", "tensor_parallel, in [cost_model] and [kv_cache] alike"),
    ("enable_dp_attention", "[cluster] data_parallel"),
])
def test_an_engines_flag_kept_in_another_table_is_named_there(key, where):
    """SGLang's --mem-fraction-static is no scheduler setting, nor near one: the error names the
    table schedlab keeps it in instead of a did-you-mean ('retraction_policy')."""
    from schedlab.configs import from_table
    from schedlab.errors import ConfigError
    from schedlab_plugins.schedulers.sglang import SglangConfig

    with pytest.raises(ConfigError, match=rf"unknown key '{key}' \(set it as {re.escape(where)}") as info:
        from_table(SglangConfig, {key: 1}, where="x [scheduler]")
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("where", ["x [cost_model]", "x [cluster.decode.cost_model]", "x [kv_cache]"])
def test_tensor_parallel_in_a_table_whose_kind_has_none_says_which_kinds_take_it(where):
    """Told to 'set it as tensor_parallel' in the very table it was set in, a user learned nothing
    (audit s57): the linear cost model has no GPUs; the roofline and profiled ones do."""
    from schedlab.configs import from_table
    from schedlab.errors import ConfigError
    from schedlab_plugins.cost_models import LinearConfig

    with pytest.raises(ConfigError) as info:
        from_table(LinearConfig, {"tensor_parallel": 2}, where=where)
    assert "this kind has none: a cost model of GPUs -- roofline, profiled --" in str(info.value)
    assert "set it as" not in str(info.value)


def _assembled(tmp_path, text):
    from schedlab.study.simulation import assemble

    path = tmp_path / "exp.toml"
    path.write_text(text)
    exp = load(path)
    return assemble(exp.studies[0].base, exp.context, "x")


def test_sglang_without_a_kv_cache_kind_gets_its_radix_tree(tmp_path):
    """SGLang caches prefixes in its radix tree unless told not to: a run whose [kv_cache] names
    no kind (or that has none) gets it, as the vllm preset gets prefix caching; a kind given wins."""
    from schedlab_plugins.kv_caches.paged import PagedKVCache
    from schedlab_plugins.kv_caches.radix import RadixKVCache

    text = BASE.format(scheduler='kind = "sglang"', cost="", kv="")
    no_kind = text.replace('[kv_cache]\nkind = "paged"\n', "[kv_cache]\n")
    assert isinstance(_assembled(tmp_path, no_kind).instances[0][2], RadixKVCache)
    start = no_kind.index("[kv_cache]")
    no_table = no_kind[:start] + no_kind[no_kind.index("[scheduler]"):]
    assert isinstance(_assembled(tmp_path, no_table).instances[0][2], RadixKVCache)
    paged = _assembled(tmp_path, text).instances[0][2]
    assert type(paged) is PagedKVCache and not paged.prefix_caching
    vllm = _assembled(tmp_path, no_kind.replace('kind = "sglang"', 'kind = "vllm"')).instances[0][2]
    assert not isinstance(vllm, RadixKVCache) and vllm.prefix_caching


@pytest.mark.parametrize("scheduler, kv, said", [
    ('kind = "sglang"\nschedule_policy = "lpm"', "", "schedule_policy = 'lpm' orders by cached prefixes, and the KV "
                                                    "cache (PagedKVCache) caches none"),
    ('kind = "sglang"\nschedule_policy = "lpm"', "prefix_caching = true", None),
    ('kind = "sglang"\nschedule_policy = "fcfs"', "", None),
    ('kind = "tgi"\nmax_waiting_tokens = 100', "", "max_waiting_tokens only gates prefill without chunking, and "
                                                  "prefill_chunking is on"),
    ('kind = "tgi"\nmax_waiting_tokens = 100\nprefill_chunking = false', "", None),
    ('kind = "tgi"\nwaiting_served_ratio = 0', "", "waiting_served_ratio only gates prefill"),
    ('kind = "vllm-v0"\npreemption = "swap"', "", "preemption = 'swap' and the KV cache (PagedKVCache) has no swap "
                                                 "space: every preemption recomputes"),
    ('kind = "vllm-v0"\npreemption = "swap"', "swap_space_gib = 4", None),
])
def test_a_setting_the_run_makes_moot_is_said(tmp_path, scheduler, kv, said):
    """Valid, but changing nothing: SGLang's cache-aware order without a prefix cache is first
    come first served; TGI's batching gate is dropped when it chunks (its default on a named GPU)."""
    path = tmp_path / "exp.toml"
    path.write_text(BASE.format(scheduler=scheduler, cost="", kv=kv))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(path)
    texts = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    if said is None:
        assert texts == []
    else:
        assert len(texts) == 1 and said in texts[0] and "[scheduler]" in texts[0]


CLASSES = """
[experiment]
name = "classes"
reports = []
timeline = false

[workload]
kind = "mix"

[workload.classes.interactive]
kind = "synthetic"
num_requests = 10
rate = 5.0
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 20}

[workload.classes.bulk]
kind = "synthetic"
num_requests = 10
rate = 5.0
request_class = "batch"
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 20}

[cluster]
instances = 2
router = {kind = "class", classes = {%s = [0], batch = [1]}}

[slo.classes.%s]
ttft_ms = 100

[client]
classes = {%s = {timeout_ms = 1000}}
"""


def test_a_class_no_request_has_is_warned_about_where_it_is_named(tmp_path):
    """Found by fuzzing: a misspelt class in [slo] classes, [client] classes or a class router
    applied to nobody without a word (the router sends its requests to the default instances).
    The mix's classes are its requests' (a sub-table's request_class, else its name)."""
    path = tmp_path / "exp.toml"
    path.write_text(CLASSES % ("interactiv", "interactiv", "interactiv"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(path)
    texts = sorted({str(w.message) for w in caught if issubclass(w.category, InputWarning)})
    assert len(texts) == 3, texts
    for place in ("[slo] classes", "[client] classes", "[cluster] router classes"):
        assert any(f"{place}: 'interactiv' is the class of no request of the workload (its classes: batch, "
                   "interactive); did you mean 'interactive'?" in t for t in texts), (place, texts)
    path.write_text(CLASSES % ("interactive", "interactive", "interactive"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        load(path)
    # a file's rows may carry classes of their own: nothing is known, nothing said
    (tmp_path / "r.jsonl").write_text('{"prompt_tokens": 10, "output_tokens": 5, "arrival_ms": 0}\n')
    text = CLASSES % ("nope", "nope", "nope")
    start, end = text.index("[workload]"), text.index("[cluster]")
    path.write_text(text[:start] + '[workload]\nkind = "file"\npath = "r.jsonl"\n\n' + text[end:])
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        load(path)
