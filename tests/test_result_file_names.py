"""Files named after runs (streamed rows, plots, traces, logs): safe, short, and never two alike --
"fast run" and "fast_run" once wrote the same requests/fast_run.parquet, one run's rows lost, and a
long run name failed after every simulation had run."""

from __future__ import annotations

import os

import numpy as np

from schedlab.results.file_names import MAX_STEM, UniqueStems, safe_stem
from schedlab.results.storage import save
from schedlab.results.stream import read_rows
from schedlab.study.experiment import load, run_experiment


def test_stems_are_unique_ignoring_case():
    stems = UniqueStems()
    assert [stems.take(safe_stem(n)) for n in ("fast run", "fast_run", "FAST RUN", "fcfs#1", "slow")] == [
        "fast_run", "fast_run-2", "FAST_RUN-3", "fcfs_1", "slow"]


def test_streamed_runs_get_a_file_each_and_long_names_are_cut(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_SPOOL", str(tmp_path / "spool"))
    long_name = "x" * 300
    path = tmp_path / "names.toml"
    path.write_text('[experiment]\nexact_requests = 10\n[workload]\nkind = "synthetic"\nnum_requests = 40\n'
                    'rate = 20\nprompt = {dist = "fixed", value = 50}\noutput = {dist = "fixed", value = 8}\n'
                    '[[runs]]\nname = "fast run"\nscheduler = {kind = "continuous", max_num_seqs = 16}\n'
                    '[[runs]]\nname = "fast_run"\nscheduler = {kind = "continuous", max_num_seqs = 1}\n'
                    f'[[runs]]\nname = "{long_name}"\nscheduler = {{kind = "continuous", max_num_seqs = 2}}\n')
    results = run_experiment(load(path))
    runs = {r.name: r for r in results.all_runs()}
    save(results, tmp_path / "out")
    files = sorted(os.listdir(tmp_path / "out" / "requests"))
    assert len(files) == 3 and files[:2] == ["fast_run-2.parquet", "fast_run.parquet"]
    assert len(files[2]) <= MAX_STEM + len(".parquet")
    # each file holds its own run's rows: one slot finishes far later than sixteen
    for name, file in (("fast run", "fast_run.parquet"), ("fast_run", "fast_run-2.parquet")):
        rows = read_rows(tmp_path / "out" / "requests" / file)
        assert rows["id"].size == 40
        assert np.max(rows["finish_ms"]) == runs[name].metrics["makespan_ms"] + np.min(rows["arrival_ms"])


def test_a_whole_table_sweep_value_is_json_in_summary_csv(tmp_path):
    """It was a Python repr ({'kind': 'static', ...}) where summary.json and run names are JSON-like."""
    import csv
    import json

    path = tmp_path / "tables.toml"
    path.write_text('[workload]\nkind = "synthetic"\nnum_requests = 5\nrate = 20\n'
                    'prompt = {dist = "fixed", value = 50}\noutput = {dist = "fixed", value = 8}\n'
                    '[[runs]]\nname = "s"\nsweep = {"scheduler" = [{kind = "static", batch_size = 4}, '
                    '{kind = "continuous"}]}\n')
    save(run_experiment(load(path)), tmp_path / "out")
    with open(tmp_path / "out" / "summary.csv") as fh:
        cells = [row["scheduler"] for row in csv.DictReader(fh)]
    assert [json.loads(cell) for cell in cells] == [{"kind": "static", "batch_size": 4}, {"kind": "continuous"}]
