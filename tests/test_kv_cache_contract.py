"""A third-party KV cache's answers, checked alike by both engines: one line naming the cache,
never a silently wrong result, a stall blamed on the scheduler, or engines that disagree.

* ``prefix_caching`` (the KVCache protocol): ``True``, both engines use ``cached_tokens``' hits;
  ``False``, neither asks; left out, both ask, and a hit stops the run (the fast engine used to
  ignore such a cache's hits while the reference engine used them);
* ``cached_tokens`` answers a whole number from 0 to ``num_tokens - 1``;
* ``allocate`` answers True or False (a ``None``: the blocks taken, the run stalled blaming no one);
* a cache's own exception names the cache, not the built-in scheduler that called it;
* once every request has left the run the cache holds no block (a leak, or blocks freed twice,
  gave wrong numbers with exit 0).
"""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

from schedlab.cli import main
from schedlab.errors import SimulationError
from schedlab.model import Request
from schedlab.testing import check_run, compare_runs, run_engine
from schedlab_plugins.kv_caches import PrefixKVCache
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

from plugin_packages import one_line

ENGINES = ("fast", "reference")

# -- prefix_caching: both engines read it alike ----------------------------------------------------


class UndeclaredPrefix(PrefixKVCache):
    """A prefix cache as a third-party author might write it: hits, and no ``prefix_caching``."""

    prefix_caching = None  # (as if left out: getattr(kv, "prefix_caching", None))


class DeclaredOff(PrefixKVCache):
    """Says it caches no prefix: the engines never ask it, whatever it would answer."""

    prefix_caching = False


#: 6 requests sharing a 64-token system prompt, one after the other (the later ones hit it)
SHARED = [Request(id=i, arrival_ms=40.0 * i, prompt_tokens=96, output_tokens=4, prefix_group="system",
                  prefix_tokens=64) for i in range(6)]


def scheduler():
    return ContinuousScheduler(ContinuousConfig(max_num_seqs=8))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cache_with_hits_must_declare_prefix_caching(engine):
    """The fast engine ran it without prefix caching, the reference engine with it."""
    with pytest.raises(SimulationError, match=(
            r"^KV cache UndeclaredPrefix's cached_tokens returned 64 for request 1, but the cache does not declare "
            r"prefix_caching = True; a cache that reuses prefixes sets that attribute \(the KVCache protocol: "
            r"schedlab/protocols.py\), for the engines and schedulers to use its hits$")):
        run_engine(SHARED, scheduler(), kv=UndeclaredPrefix(256, 16), engine=engine)


def test_a_declared_prefix_cache_gives_the_same_run_on_both_engines():
    runs = [run_engine(SHARED, scheduler(), kv=PrefixKVCache(256, 16), engine=engine) for engine in ENGINES]
    compare_runs(*runs)
    for run in runs:
        check_run(run, SHARED)
        assert run.counters["prefix_hits"] == 5 * 64


def test_a_cache_declaring_no_prefix_caching_is_never_asked():
    """The reference engine used its hits although it said it had none."""
    runs = [run_engine(SHARED, scheduler(), kv=DeclaredOff(256, 16), engine=engine) for engine in ENGINES]
    compare_runs(*runs)
    for run in runs:
        assert run.counters["prefix_hits"] == 0
        assert run.requests["cached_tokens"].tolist() == [0] * 6


# -- a cache's answers, through the command line ---------------------------------------------------

HEADER = """
import attrs
import schedlab
from schedlab.configs import str_field
"""

CACHE = """
@attrs.frozen
class Settings:
    mode: str = str_field("ok", help="which bug")

class CountingKV:
    block_size = 16
    num_blocks = 300

    def __init__(self, config):
        self.mode = config.mode
        self.used = 0
        if config.mode.startswith("cached"):
            self.prefix_caching = True

    def _held(self, seq):
        return -(-max(seq.num_computed_tokens, seq.reserved_tokens) // self.block_size)

    def num_free_blocks(self):
        return None if self.mode == "free_none" else self.num_blocks - self.used

    def num_used_blocks(self):
        return self.used

    def cached_tokens(self, seq):
        return {"cached_neg": -16, "cached_all": seq.num_tokens, "cached_beyond": seq.num_tokens + 100,
                "cached_float": 16.5, "cached_str": "16", "cached_bool": True}.get(self.mode, 0)

    def blocks_needed(self, seq, num_new_tokens, *, cached_tokens=0, reserve_tokens=0):
        tokens = max(seq.num_computed_tokens + cached_tokens + num_new_tokens, reserve_tokens, seq.reserved_tokens)
        return max(0, -(-tokens // self.block_size) - self._held(seq))

    def allocate(self, seq, num_new_tokens, *, cached_tokens=0, reserve_tokens=0):
        need = self.blocks_needed(seq, num_new_tokens, cached_tokens=cached_tokens, reserve_tokens=reserve_tokens)
        if need > self.num_free_blocks():
            return False
        self.used += need
        return None if self.mode == "alloc_none" else True

    def free(self, seq, *, preempted=False):
        held = self._held(seq)
        self.used -= {"leak": 0, "leak_one": max(0, held - 1), "double_free": 2 * held}.get(self.mode, held)

@schedlab.hookimpl
def schedlab_register_kv_caches(register):
    register("counting", CountingKV, config=Settings)
"""

EXPERIMENT = """
[experiment]
name = "kv"
plugins = ["{module}"]
reports = ["json"]
engine = "{engine}"

[workload]
kind = "synthetic"
num_requests = {requests}
prompt = {{dist = "fixed", value = 100}}
output = {{dist = "fixed", value = 20}}
arrival = "poisson"
rate = 20

[scheduler]
kind = "continuous"
max_num_seqs = 64

[kv_cache]
kind = "counting"
mode = "{mode}"
"""

_numbers = itertools.count()


@pytest.fixture
def run_cache(tmp_path, monkeypatch):
    """``run_cache(mode, engine, requests=20)``: run the counting cache with its bug ``mode`` through the
    command line; returns (exit status, the experiment's path)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = []

    def make(mode: str, engine: str, requests: int = 20):
        module = f"kv_contract_plugin_{next(_numbers)}"
        modules.append(module)
        (tmp_path / f"{module}.py").write_text(HEADER + textwrap.dedent(CACHE))
        path = tmp_path / f"{module}.toml"
        path.write_text(EXPERIMENT.format(module=module, engine=engine, mode=mode, requests=requests))
        return main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"]), path

    yield make
    for module in modules:
        sys.modules.pop(module, None)


RANGE = "; a hit is from 0 to num_tokens - 1 (the last token is always computed)"
WHOLE = "; it answers a whole number of tokens, from 0 to 99 (the sequence's num_tokens - 1)"


@pytest.mark.parametrize("mode, message", [
    ("cached_neg", "returned -16 for request 0, which has 100 tokens" + RANGE),  # (ran on, exit 0, prompts recomputed)
    ("cached_all", "returned 100 for request 0, which has 100 tokens" + RANGE),  # (a stall at t=0)
    ("cached_beyond", "returned 200 for request 0, which has 100 tokens" + RANGE),  # (blamed on the scheduler)
    ("cached_float", "returned 16.5 (float) for request 0" + WHOLE),
    ("cached_str", "returned '16' (str) for request 0" + WHOLE),  # (the built-in scheduler raised TypeError)
    ("cached_bool", "returned True (bool) for request 0" + WHOLE),
])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_cached_tokens_answer_out_of_its_range(run_cache, capsys, mode, message, engine):
    code, path = run_cache(mode, engine)
    assert one_line(code, capsys.readouterr().err) == f"{path}: run 'kv': kv cache 'counting' (plugin {path.stem})'s cached_tokens {message}"


@pytest.mark.parametrize("engine", ENGINES)
def test_allocate_returning_none(run_cache, capsys, engine):
    """A forgotten ``return True``: the cache took the blocks, the engine read a refusal, and the run
    stalled at t=0 naming the scheduler."""
    code, path = run_cache("alloc_none", engine)
    assert one_line(code, capsys.readouterr().err) == (
        f"{path}: run 'kv': kv cache 'counting' (plugin {path.stem})'s allocate returned None; it returns True when it "
        "made room, False "
        "(changing nothing) when the blocks are not free")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_cache_raising_under_a_built_in_scheduler_is_blamed(run_cache, capsys, engine):
    """``num_free_blocks()`` returning None fails inside the cache's own ``allocate``, called by the
    built-in scheduler: the error named the scheduler (the outermost plugin frame)."""
    code, path = run_cache("free_none", engine)
    message = one_line(code, capsys.readouterr().err)
    assert message.startswith(
        f"{path}: run 'kv': kv cache 'counting' (plugin {path.stem}) raised TypeError: '>' not supported between "
        f"instances of 'int' and 'NoneType' ({path.stem}.py:"), message
    assert " in CountingKV.allocate; SCHEDLAB_TRACEBACK=1 prints the traceback)" in message, message


SCHEDULER_WROTE = ("; or the scheduler wrote a sequence's read-only fields (num_computed_tokens, reserved_tokens, "
                   "...), which the plan's actions keep")  # (review s81 plugin, finding 3: the cache alone was blamed)


@pytest.mark.parametrize("mode, message", [
    ("leak_one", "reports 20 used blocks of 300 once every request has left the run: its free() did not release "
                 "every block allocate() took (a leak)" + SCHEDULER_WROTE),
    ("double_free", "reports -160 used blocks of 300 once every request has left the run: its free() released "
                    "more than allocate() took (blocks freed twice?)" + SCHEDULER_WROTE),
])
@pytest.mark.parametrize("engine", ENGINES)
def test_blocks_left_or_freed_twice_at_the_end(run_cache, capsys, mode, message, engine):
    """Both ran to the end with exit 0 and wrong numbers (a double free makes the cache unbounded)."""
    code, path = run_cache(mode, engine)
    assert one_line(code, capsys.readouterr().err) == f"{path}: run 'kv': kv cache 'counting' (plugin {path.stem}) {message}"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stall_with_blocks_nobody_holds_says_so(run_cache, capsys, engine):
    """A ``free()`` that releases nothing stalls the run once its 300 blocks are gone (60 requests of 8
    blocks): the message blamed the scheduler ("must preempt"), or no one; it points at the cache now."""
    code, _ = run_cache("leak", engine, requests=60)
    message = one_line(code, capsys.readouterr().err)
    assert "stalled at" in message, message
    assert message.endswith("used blocks with no request running or swapped out: its free() may not release every "
                            "block allocate() took (a leak)"), message


@pytest.mark.parametrize("engine", ENGINES)
def test_the_counting_cache_without_bugs_runs(run_cache, capsys, engine):
    code, _ = run_cache("ok", engine)
    assert code == 0, capsys.readouterr().err
