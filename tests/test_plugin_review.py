"""A plugin author's view, from a review of it: a KV cache whose accounting disagrees with itself is
named with its verb intact, and a built-in cache subclassed through a factory function warns that
the fast engine bypasses its allocate()."""

from __future__ import annotations

import test_plugin_mistakes

plugin = test_plugin_mistakes.plugin  # (the fixture: a plugin module of its own, run through the command line)

RESERVE_PAGED = """
from schedlab_plugins.kv_caches import PagedKVCache
from schedlab_plugins.kv_caches.settings import PagedConfig


class ReservePaged(PagedKVCache):
    \"\"\"Keeps 8 blocks back from every allocation (overrides allocate() alone: a planted bug).\"\"\"

    def allocate(self, seq, n, *, cached_tokens=0, reserve_tokens=0, received=False):
        need = self.blocks_needed(seq, n, cached_tokens=cached_tokens, reserve_tokens=reserve_tokens)
        if need > self.num_free_blocks() - 8:
            return False
        return super().allocate(seq, n, cached_tokens=cached_tokens, reserve_tokens=reserve_tokens,
                                received=received)


def make(config):
    \"\"\"paged, keeping 8 blocks back\"\"\"
    return ReservePaged(config.num_blocks, config.block_size)


@schedlab.hookimpl
def schedlab_register_kv_caches(register):
    register("reserve-paged", make, config=PagedConfig)
"""
TABLES = """
[scheduler]
kind = "continuous"
allocation = "grow"
max_num_seqs = 8
[cost_model]
kind = "linear"
decode_ms_per_step = 200.0
[kv_cache]
kind = "reserve-paged"
num_blocks = 58
block_size = 4
"""


def test_a_cache_subclassed_through_a_factory_warns_and_its_refusal_keeps_its_verb(plugin, capsys):
    """The warning fired only for a class registered as the factory (the built-in paged cache is
    registered through a function); and the engine's "KV cache refused a decode slot" lost its
    verb to the plugin's name: "kv cache 'x' (plugin m) a decode slot it had reported free"."""
    code, path = plugin(RESERVE_PAGED, TABLES, "run", engine="reference")
    assert code != 0
    err = capsys.readouterr().err
    assert "refused a decode slot it had reported free (its blocks_needed() and num_free_blocks() said it fits)" in err
    assert f"kv cache 'reserve-paged' (plugin {path.stem}) refused a decode slot" in err
    warned = f"kv cache 'reserve-paged' (plugin {path.stem}): ReservePaged overrides allocate() but inherits grow()"
    assert err.count(warned) == 1  # (said where the experiment loaded, not again by the run)


HOLD_BACK = """
class HoldBack(ContinuousScheduler):
    \"\"\"Holds every arrival back 30 ms without saying when to ask again (a planted bug).\"\"\"

    def schedule(self, plan):
        if any(plan.now < seq.request.arrival_ms + 30.0 for seq in plan.waiting):
            plan.decode_all()
            return
        super().schedule(plan)


@schedlab.hookimpl
def schedlab_register_schedulers(register):
    register("hold-back", HoldBack, config=ContinuousConfig)
"""


def test_a_stall_with_an_empty_cache_says_a_hold_needs_a_wake_up(plugin, capsys):
    """It said only the counts: a scheduler holding requests back by time, with nothing else to
    happen, is never asked again -- plan.wake_at is what it lacks."""
    code, path = plugin(HOLD_BACK, '[scheduler]\nkind = "hold-back"\n[cost_model]\nkind = "linear"\n', "run")
    assert code != 0
    err = capsys.readouterr().err
    assert "stalled at" in err and "the cache is empty and request" in err
    assert "must say when (plan.wake_at(time_ms) or plan.wake_after(decode_steps))" in err


def test_the_swap_note_names_the_built_in_caches_keys_only_for_them():
    """A third-party cache without swap space was told to set swap_space_gib or swap_blocks, keys
    only the built-in paged cache has."""
    from schedlab_plugins.kv_caches import PagedKVCache
    from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

    class MyPool:  # (a plugin's own cache: no swap space)
        block_size, num_blocks = 16, 64

    scheduler = ContinuousScheduler(ContinuousConfig(allocation="grow", preemption="swap"))
    (own,) = scheduler.setting_notes(MyPool())
    assert own.endswith("every preemption recomputes (a cache with swap space, swap_out() and swap_in(), gives it "
                        "some)")
    (built_in,) = scheduler.setting_notes(PagedKVCache(64, 16))
    assert built_in.endswith("([kv_cache] swap_space_gib or swap_blocks gives it some)")
