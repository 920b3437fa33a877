"""Names of the runs an experiment makes, and which of them an error is blamed on.

Results are kept by run name (requests.csv rows, config.json, timings.json): a ``[[runs]]`` entry
named like another entry's sweep point, replica or search probe once ran and wrote one run's rows
twice under one name, and ``schedlab plot`` then refused the folder. An error in a table a sweep
does not touch was blamed on the sweep's first point."""

from __future__ import annotations

import pytest

from schedlab.errors import ConfigError
from schedlab.study.experiment import load

WORKLOAD = ('[workload]\nkind = "synthetic"\nnum_requests = 5\nrate = 1.0\n'
            'prompt = {dist = "fixed", value = 10}\noutput = {dist = "fixed", value = 2}\n')


def write(tmp_path, runs: str, workload: str = WORKLOAD):
    path = tmp_path / "names.toml"
    path.write_text(workload + runs)
    return path


@pytest.mark.parametrize("runs, name, owners", [
    ('[[runs]]\nname = "cont[max_num_seqs=4]"\n[[runs]]\nname = "cont"\nsweep = {"scheduler.max_num_seqs" = [4, 8]}\n',
     "cont[max_num_seqs=4]", ("[[runs]] 'cont[max_num_seqs=4]'", "a sweep point or replica of [[runs]] 'cont'")),
    ('[[runs]]\nname = "a"\nreplicas = 2\n[[runs]]\nname = "a#1"\n',
     "a#1", ("a sweep point or replica of [[runs]] 'a'", "[[runs]] 'a#1'")),
    ('[[runs]]\nname = "s"\nsweep = {"workload.rate" = [1.0, 2.0]}\nreplicas = 2\n'
     '[[runs]]\nname = "s[rate=2.0]#2"\n',
     "s[rate=2.0]#2", ("a sweep point or replica of [[runs]] 's'", "[[runs]] 's[rate=2.0]#2'")),
])
def test_two_runs_of_one_name_are_refused(tmp_path, runs, name, owners):
    with pytest.raises(ConfigError, match="two runs would be named") as err:
        load(write(tmp_path, runs))
    message = str(err.value)
    assert f"{name!r}" in message and all(owner in message for owner in owners)


def test_a_run_named_as_a_search_probe_is_refused(tmp_path):
    runs = ('[slo]\nttft_ms = 500\n[[runs]]\nname = "s"\n'
            'search = {key = "workload.rate", low = 1, high = 8, constraint = "slo.attainment >= 0.9"}\n'
            '[[runs]]\nname = "s[rate=3]"\n')
    with pytest.raises(ConfigError, match=r"\[\[runs\]\] 's\[rate=3\]' is named as the probes of \[\[runs\]\] 's'"):
        load(write(tmp_path, runs))


def test_distinct_names_pass(tmp_path):
    runs = ('[[runs]]\nname = "cont"\nsweep = {"scheduler.max_num_seqs" = [4, 8]}\nreplicas = 2\n'
            '[[runs]]\nname = "cont[max_num_seqs=16]"\n[[runs]]\nname = "cont#3"\n')
    exp = load(write(tmp_path, runs))
    assert [s.name for s in exp.studies] == ["cont", "cont[max_num_seqs=16]", "cont#3"]


def test_an_error_outside_the_swept_keys_is_not_blamed_on_a_point(tmp_path):
    bad = WORKLOAD.replace('prompt = {dist = "fixed", value = 10}', 'prompt = {dist = "constant", value = 10}')
    with pytest.raises(ConfigError, match="dist must be one of") as err:
        load(write(tmp_path, '[[runs]]\nname = "r"\nsweep = {"workload.rate" = [1.0, 2.0]}\n', bad))
    assert "point" not in str(err.value) and "defaults" not in str(err.value)
    # an error in a key the sweep sets is still the point's
    with pytest.raises(ConfigError, match=r"at the sweep's point scheduler.max_num_seqs = 0"):
        load(write(tmp_path, '[[runs]]\nname = "r"\nsweep = {"scheduler.max_num_seqs" = [4, 0]}\n'))


# -- where a mistake is, said so (the new-user review) ---------------------------------------------


def test_a_typo_in_a_top_level_table_a_run_takes_says_it_is_up_there(tmp_path):
    """It was reported as the first run's table, which the run never wrote."""
    runs = '[scheduler]\nkind = "continuous"\nmax_num_seq = 8\n[[runs]]\nname = "a"\n[[runs]]\nname = "b"\n'
    with pytest.raises(ConfigError, match=r"\[\[runs\]\] 'a' \[scheduler\]: unknown key 'max_num_seq' .*"
                                          r"\(in the file's top-level \[scheduler\], which this run takes\)$"):
        load(write(tmp_path, runs))


def test_top_level_and_run_keys_get_a_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'schedular' \(did you mean 'scheduler'\?\)"):
        load(write(tmp_path, '[schedular]\nkind = "vllm"\n'))
    with pytest.raises(ConfigError, match=r"unknown key 'nmae' \(did you mean 'name'\?\)"):
        load(write(tmp_path, '[[runs]]\nnmae = "x"\n'))


def test_a_misspelt_report_is_the_report_lists(tmp_path):
    """It was blamed on a [reports.plts] table that does not exist."""
    with pytest.raises(ConfigError, match=r"\[experiment\] reports: unknown report 'plts' \(did you mean 'plots'\?\)"):
        load(write(tmp_path, '[experiment]\nreports = ["table", "plts"]\n'))
