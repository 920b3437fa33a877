"""SGLang's ``--enable-dp-attention`` as ``[cluster] data_parallel`` with the ``sglang`` scheduler:
the settings SGLang changes on each rank (``server_args._handle_data_parallelism``,
``ModelRunner``'s ``max_running_requests // dp_size``), the rank router SGLang's controller
dispatches with by default (round robin), and the hints for SGLang's ``--dp`` flags."""

from __future__ import annotations

import re
import textwrap

import pytest

from schedlab.study.experiment import load, run_experiment
from schedlab.study.simulation import assemble
from schedlab.testing import compare_runs

#: Qwen3-30B-A3B (a MoE model: its ranks step together) on H100-80GB, whose chunk SGLang sizes
#: at 8,192 tokens; requests a second apart, each done long before the next
BASE = """
    [experiment]
    name = "x"
    reports = []
    timeline = false
    [workload]
    kind = "synthetic"
    num_requests = 6
    rate = 1.0
    arrival = "constant"
    prompt = {dist = "fixed", value = 100}
    output = {dist = "fixed", value = 2}
    [kv_cache]
    model = "qwen3-30b-a3b"
    gpu = "h100-80gb"
    [cost_model]
    kind = "roofline"
    model = "qwen3-30b-a3b"
    gpu = "h100-80gb"
"""


def _path(tmp_path, scheduler: str, cluster: str = ""):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(BASE) + f"[scheduler]\n{scheduler}\n" + (f"[cluster]\n{cluster}\n" if cluster
                                                                              else ""))
    return path


def _schedulers(tmp_path, scheduler: str, cluster: str = "") -> list:
    """Every instance's (rank's) scheduler as the run builds it."""
    exp = load(_path(tmp_path, scheduler, cluster))
    return [parts[0] for parts in assemble(exp.studies[0].base, exp.context, "x").instances]


def _run(tmp_path, scheduler: str, cluster: str = ""):
    return run_experiment(load(_path(tmp_path, scheduler, cluster))).all_runs()[0]


# -- finding 1: chunked_prefill_size // dp, schedule_conservativeness x 0.3 ------------------------------


@pytest.mark.parametrize("scheduler, chunk", [
    ('kind = "sglang"', 4096),                                  # the GPU's 8,192, divided
    ('kind = "sglang"\nchunked_prefill_size = 2048', 1024),     # a value written, divided too
    ('kind = "sglang"\nchunked_prefill_size = 0', 0),           # chunking off stays off
])
def test_each_dp_attention_rank_chunks_at_the_chunk_divided_by_the_ranks(tmp_path, scheduler, chunk):
    """SGLang divides whatever chunk it ends up with by ``dp_size`` (``_handle_data_parallelism``:
    "The chunked prefill size is adjusted to ... to avoid MoE kernel issues") and scales
    ``schedule_conservativeness`` by 0.3, so the initial new_token_ratio is 0.7 x 0.3."""
    ranks = _schedulers(tmp_path, scheduler, "data_parallel = 2\nexpert_parallel = true")
    assert len(ranks) == 2
    for rank in ranks:
        assert rank.config.chunked_prefill_size == chunk
        assert rank.config.schedule_conservativeness == pytest.approx(0.3)
        assert rank.init_ratio == pytest.approx(0.21)


def test_a_written_conservativeness_is_scaled_and_one_instance_keeps_its_settings(tmp_path):
    [rank, _] = _schedulers(tmp_path, 'kind = "sglang"\nschedule_conservativeness = 2.0', "data_parallel = 2")
    assert rank.config.schedule_conservativeness == pytest.approx(0.6)
    [alone] = _schedulers(tmp_path, 'kind = "sglang"')
    assert (alone.config.chunked_prefill_size, alone.config.schedule_conservativeness) == (8192, 1.0)


def test_the_run_says_the_settings_a_rank_ran_with(tmp_path):
    """``meta["scheduler"]`` is the settings as the scheduler ran them: a rank's."""
    run = _run(tmp_path, 'kind = "sglang"\nmax_running_requests = 9', "data_parallel = 2")
    said = run.meta["scheduler"]
    assert (said["chunked_prefill_size"], said["max_running_requests"]) == (4096, 4)
    assert said["schedule_conservativeness"] == pytest.approx(0.3)


def test_a_chunk_the_ranks_leave_at_zero_turns_mixed_chunks_off_as_sglang_does(tmp_path):
    """SGLang mixes only with a chunk (``is_mixed_chunk``): 1 // 2 leaves none, and mixing off."""
    ranks = _schedulers(tmp_path, 'kind = "sglang"\nchunked_prefill_size = 1\nenable_mixed_chunk = true',
                        "data_parallel = 2")
    assert [(r.config.chunked_prefill_size, r.config.enable_mixed_chunk) for r in ranks] == [(0, False)] * 2


def test_a_rank_chunk_of_part_pages_is_refused_saying_it_was_divided(tmp_path):
    from schedlab.errors import ConfigError

    path = _path(tmp_path, 'kind = "sglang"\nchunked_prefill_size = 96', "data_parallel = 4")
    text = path.read_text().replace('[kv_cache]\n', '[kv_cache]\nblock_size = 16\n')
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape("chunked_prefill_size = 24 (a rank's: the value divided by "
                                                    "data_parallel = 4) is not a multiple of the page")) as err:
        exp = load(path)
        assemble(exp.studies[0].base, exp.context, "x")
    # (it said what is wrong, not what to change: a review)
    assert str(err.value).endswith("set [kv_cache] block_size = 1 (SGLang's default page_size) or [scheduler] "
                                   "chunked_prefill_size to a multiple, such as 16 (64 for the 4 ranks)")


# -- finding 2: an explicit max_running_requests // dp ------------------------------------------------


@pytest.mark.parametrize("written, ranks, per_rank", [(256, 4, 64), (9, 2, 4), (1, 2, 1), (0, 2, 0)])
def test_a_max_running_requests_set_is_split_over_the_ranks(tmp_path, written, ranks, per_rank):
    """SGLang's ``ModelRunner``: ``server_args.max_running_requests // dp_size`` per rank (here at
    least 1); unset (0), each rank sizes its own from its pool, as one instance does."""
    table = 'kind = "sglang"' + (f"\nmax_running_requests = {written}" if written else "")
    schedulers = _schedulers(tmp_path, table, f"data_parallel = {ranks}\nexpert_parallel = true")
    assert [s.config.max_running_requests for s in schedulers] == [per_rank] * ranks
    if written:
        assert [s.slots for s in schedulers] == [per_rank] * ranks
    else:  # SGLang's own from the rank's pool: 2,048 to 4,096
        assert all(2048 <= s.slots <= 4096 for s in schedulers)


# -- finding 3: the rank router follows the scheduler's engine ----------------------------------------


def _ranks_of(run) -> list:
    ranks = dict(zip(run.requests["id"].tolist(), run.requests["instance"].tolist()))
    return [ranks[i] for i in sorted(ranks)]


def test_sglang_ranks_are_picked_round_robin_by_default(tmp_path):
    """Requests a second apart, each finished before the next: SGLang's controller alternates;
    vLLM's balancer sees every rank idle, and vLLM 0.19's sends each to rank 0 (ties to the
    lowest) while 0.33's (the default) rotates its ties."""
    assert _ranks_of(_run(tmp_path, 'kind = "sglang"', "data_parallel = 2")) == [0, 1, 0, 1, 0, 1]
    assert _ranks_of(_run(tmp_path, 'kind = "vllm"', "data_parallel = 2")) == [0, 1, 0, 1, 0, 1]
    old = 'data_parallel = 2\nrank_router = {kind = "vllm_dp", rule = "v0.19"}'
    assert _ranks_of(_run(tmp_path, 'kind = "vllm"', old)) == [0] * 6


@pytest.mark.parametrize("cluster", [
    'data_parallel = 2\nrouter = {kind = "vllm_dp", rule = "v0.19"}',       # (0.19: idle ties to rank 0)
    'data_parallel = 2\nrank_router = {kind = "vllm_dp", rule = "v0.19"}',
])
def test_a_router_named_wins_over_sglangs_default(tmp_path, cluster):
    assert _ranks_of(_run(tmp_path, 'kind = "sglang"', cluster)) == [0] * 6


def test_each_deployment_of_sglang_ranks_picks_them_round_robin(tmp_path):
    """Several deployments: the cluster's router picks the deployment (round robin), each
    deployment's rank router the rank (SGLang's: round robin; named: it)."""
    from schedlab_plugins.routers import DataParallelRouter, RoundRobinRouter

    def rank_routers(scheduler, cluster):
        exp = load(_path(tmp_path, scheduler, cluster))
        return assemble(exp.studies[0].base, exp.context, "x").rank_routers

    layout = "data_parallel = 2\ninstances = 2"
    assert all(type(r) is RoundRobinRouter for r in rank_routers('kind = "sglang"', layout))
    assert all(type(r) is DataParallelRouter for r in rank_routers('kind = "vllm"', layout))
    named = rank_routers('kind = "sglang"', layout + '\nrank_router = {kind = "vllm_dp"}')
    assert all(type(r) is DataParallelRouter for r in named)


def test_a_dense_models_sglang_ranks_are_instances_behind_round_robin(tmp_path):
    """A dense model's ranks do not step together: independent instances behind the router the
    scheduler's engine dispatches with."""
    from schedlab_plugins.routers import DataParallelRouter, RoundRobinRouter

    def router(scheduler):
        path = _path(tmp_path, scheduler, "data_parallel = 2")
        path.write_text(path.read_text().replace("qwen3-30b-a3b", "llama-3.1-8b"))
        exp = load(path)
        return assemble(exp.studies[0].base, exp.context, "x").router

    assert type(router('kind = "sglang"')) is RoundRobinRouter
    assert type(router('kind = "vllm"')) is DataParallelRouter


# -- finding 9: the hints for SGLang's --dp flags ----------------------------------------------------


@pytest.mark.parametrize("key, said", [
    ("dp_size", "[cluster] data_parallel with SGLang's --enable-dp-attention; without it SGLang's --dp N is N "
                "independent replicas: [cluster] instances = N with router = {kind = \"round_robin\"}"),
    ("enable_dp_attention", "chunked_prefill_size and a max_running_requests set divided by data_parallel, "
                            "schedule_conservativeness x 0.3"),
    ("data_parallel_size", "[cluster] data_parallel)"),
])
def test_sglangs_dp_flags_in_the_scheduler_table_say_where_they_go(key, said):
    from schedlab.configs import from_table
    from schedlab.errors import ConfigError
    from schedlab_plugins.schedulers.sglang import SglangConfig

    with pytest.raises(ConfigError, match=rf"unknown key '{key}' \(set it as ") as info:
        from_table(SglangConfig, {key: 2}, where="x [scheduler]")
    assert said in str(info.value)


DPA_WAITING_TIMEOUT = """
[experiment]
reports = []
seed = 670
[workload]
kind = "closed_loop"
clients = 3
num_requests = 5
prompt = {dist = "fixed", value = 140}
output = {dist = "fixed", value = 32}
[scheduler]
kind = "sglang"
max_running_requests = 2
chunked_prefill_size = 32
overlap_schedule = false
waiting_timeout_ms = 50.0
[cost_model]
kind = "roofline"
model = "mixtral-8x7b"
gpu = "h100-80gb"
tensor_parallel = 2
[cluster]
data_parallel = 2
[kv_cache]
kind = "paged"
block_size = 16
num_blocks = 400
bytes_per_block = 1048576
[[runs]]
name = "fast"
[[runs]]
name = "reference"
engine = "reference"
"""


def test_a_request_turned_away_on_its_waiting_timeout_releases_its_clients_next_at_once(tmp_path):
    """One running request a rank, a third client waiting: SGLang turns its request away after 50 ms
    in the queue, at a plan. The client's next request arrives then -- the fast engine's ranks ran
    a bulk decode run first and released it 204 ms later (engines review s78). Each follow-up of
    that client arrives at its predecessor's rejection, in both engines alike."""
    path = tmp_path / "dpa.toml"
    path.write_text(DPA_WAITING_TIMEOUT)
    fast, reference = run_experiment(load(path)).all_runs()
    compare_runs(fast, reference, rel=1e-9)
    rows = fast.requests
    rejected = [i for i in range(5) if rows["rejected"][i]]
    assert rejected[:3] == [2, 3, 4]
    for before, after in zip(rejected, rejected[1:3]):
        assert rows["client"][after] == rows["client"][before]
        assert rows["arrival_ms"][after] == rows["finish_ms"][before]  # (released at the rejection)
