"""The conformance kit's Hypothesis settings keep a third-party plugin's tests green on a slow
machine: the README's example, run by pytest outside this project's conftest (which turns
deadlines off for schedlab's own suite only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SLOW_TEST = '''
import time
from hypothesis import given, settings
from schedlab.testing import check_run, kit_settings, requests_lists, run_engine
from schedlab_plugins.schedulers import ContinuousConfig, ContinuousScheduler

{decorator}
@given(requests_lists(max_size=3))
def test_plugin_on_a_busy_machine(requests):
    time.sleep(0.25)  # a busy CI machine: every example takes longer than Hypothesis' 200 ms default
    result = run_engine(requests, ContinuousScheduler(ContinuousConfig(max_num_seqs=4)), kv_blocks=64)
    check_run(result, requests, max_running=4)
'''


@pytest.mark.parametrize("decorator, passes", [
    ("@settings(kit_settings, max_examples=3)", True),
    # the control: Hypothesis' default deadline (200 ms) fails it. Written out because Hypothesis
    # drops its deadline by itself when it sees a CI environment variable, which is where we run.
    ("@settings(max_examples=3, deadline=200)", False),
])
def test_kit_settings_turn_off_the_per_example_deadline(tmp_path, decorator, passes):
    (tmp_path / "test_third_party.py").write_text(textwrap.dedent(SLOW_TEST.format(decorator=decorator)))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_third_party.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    if passes:
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        assert done.returncode != 0 and "DeadlineExceeded" in done.stdout
