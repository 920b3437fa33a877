"""Hostile and absurd input: every case ends as one error line and exit status 2, or as a
correct run -- never a traceback, a hang or a wrong result with exit status 0.

Each case here once printed a traceback, hung or silently lost requests (issue 11). The CLI
is called in-process (``schedlab.cli.main``) where that suffices, and in a subprocess where a
hang or the process's own output (warnings, exit) is what is tested.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from schedlab.cli import main

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "experiments" / "quickstart.toml"

BASE = """
[experiment]
name = "hostile"
reports = ["table", "json"]

[workload]
kind = "synthetic"
num_requests = 20
prompt = {dist = "fixed", value = 100}
output = {dist = "fixed", value = 20}
arrival = "poisson"
rate = 10
"""


def one_error(code: int, err: str, *fragments: str) -> str:
    """Exit 2, no traceback, and one ``schedlab: error:`` line (the last) naming each fragment.
    Besides it stderr may only hold the run's opening line (``schedlab: <name>: N run(s)``)."""
    assert code == 2, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = err.strip().split("\n")
    assert lines[-1].startswith("schedlab: error: "), err
    assert all(line.startswith("schedlab: ") and "run(s)" in line for line in lines[:-1]), err
    for fragment in fragments:
        assert fragment in lines[-1], (fragment, lines[-1])
    return lines[-1]


def run_file(tmp_path, capsys, text: str, *extra: str, command: str = "run"):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    args = [command, str(path)] + (["--out", str(tmp_path / "out")] if command == "run" else []) + list(extra)
    code = main(args)
    return code, capsys.readouterr().err


# -- the experiment file -------------------------------------------------------------------------

FILE_CASES = {
    "experiment is a number": ("experiment = 5\n" + BASE.replace('[experiment]\nname = "hostile"\n'
                                                                 'reports = ["table", "json"]\n', ""),
                               ["experiment must be one table"]),
    "experiment is an array of tables": (BASE.replace("[experiment]", "[[experiment]]"),
                                         ["experiment must be one table", "array"]),
    "a run named by a number": (BASE + "[[runs]]\nname = 5\n", ["[[runs]] number 1: name must be non-empty text"]),
    # a list or a table was looked up as a --set target first: TypeError, unhashable (fuzz review s78)
    "a run named by a list": (BASE + '[[runs]]\nname = ["static"]\n',
                              ["[[runs]] number 1: name must be non-empty text, got ['static']"]),
    "a run named by a table": (BASE + '[[runs]]\nname = "a"\n[[runs]]\nname = {a = 1}\n',
                               ["[[runs]] number 2: name must be non-empty text, got {'a': 1}"]),
    "swap space without model and gpu": (BASE + '[kv_cache]\nkind = "paged"\nswap_space_gib = 4\n',
                                         ["[kv_cache]: swap_space_gib: needs bytes_per_block"]),
    "block size 10**9": (BASE + '[kv_cache]\nkind = "paged"\nblock_size = 1000000000\n',
                         ["[kv_cache]: block_size: must be <= 4096"]),
    "block size 10**30": (BASE + '[kv_cache]\nkind = "paged"\nblock_size = 1000000000000000000000000000000\n',
                          ["[kv_cache]: block_size: must be <= 4096"]),
    "num_blocks 10**30": (BASE + '[kv_cache]\nkind = "paged"\nnum_blocks = 1000000000000000000000000000000\n',
                          ["[kv_cache]: num_blocks: must be <= 2**53"]),
    "prompt of 10**9 tokens": (BASE.replace("value = 100", "value = 1000000000"),
                               ["[workload]: prompt: value must be a whole number >= 1 and <= 10**8"]),
    "prompt of 10**30 tokens": (BASE.replace("value = 100", "value = " + "1" + "0" * 30),
                                ["[workload]: prompt: value must be a whole number >= 1 and <= 10**8"]),
    "output of 10**30 tokens": (BASE.replace("value = 20", "value = " + "1" + "0" * 30),
                                ["[workload]: output: value must be a whole number"]),
    "uniform up to 10**30": (BASE.replace('{dist = "fixed", value = 20}',
                                          '{dist = "uniform", low = 1, high = 1' + "0" * 30 + "}"),
                             ["[workload]: output: high must be a whole number >= 1 and <= 10**8"]),
    "lognormal median 1e300": (BASE.replace('{dist = "fixed", value = 20}',
                                            '{dist = "lognormal", median = 1e300, sigma = 1}'),
                               ["[workload]: output: median must be a number > 0 and <= 1e+08"]),
    "max_tokens 10**30": (BASE.replace("rate = 10", "rate = 10\nmax_tokens = 1" + "0" * 30),
                          ["[workload]: max_tokens: must be <= 10**8"]),
    "num_requests 10**30": (BASE.replace("num_requests = 20", "num_requests = 1" + "0" * 30),
                            ["[workload]: num_requests: must be <= 10**7"]),
    "gamma cv inf": (BASE.replace('arrival = "poisson"', 'arrival = "gamma"\ncv = inf'),
                     ["[workload]: cv: must be a finite number"]),
    "gamma cv 1e10": (BASE.replace('arrival = "poisson"', 'arrival = "gamma"\ncv = 1e10'),
                      ["[workload]: cv: must be <= 100"]),
    "instances 10**30": (BASE + "[cluster]\ninstances = 1" + "0" * 30 + "\n", ["[cluster]: instances: must be <= 1024"]),
    "instances 100000": (BASE + "[cluster]\ninstances = 100000\n", ["[cluster]: instances: must be <= 1024"]),
    "negative seed": (BASE.replace('name = "hostile"', 'name = "hostile"\nseed = -1'), ["seed: must be >= 0"]),
    "a prefill pool of 100000": (BASE + '[cluster]\nmode = "disaggregated"\nprefill = {instances = 100000}\n',
                                 ["[cluster.prefill]: instances: must be <= 1024"]),
    "unknown table column": (BASE + '[reports.table]\ncolumns = ["finished", "bogus.p99"]\n',
                             ["[reports.table]: columns: unknown metric 'bogus.p99'", "ttft_ms", "throughput_tps"]),
    "unknown percentile": (BASE + '[reports.table]\ncolumns = ["ttft_ms.p999"]\n',
                           ["unknown metric 'ttft_ms.p999' (did you mean 'ttft_ms.p99'?): 'ttft_ms' has mean, p50, "
                            "p90, p95, p99, max"]),
    "a metric group as a column": (BASE + '[reports.table]\ncolumns = ["ttft_ms"]\n',
                                   ["'ttft_ms' is a group of metrics", "ttft_ms.p99"]),
    "unknown best metric": (BASE + '[reports.plots]\nbest = "goodput"\n', ["[reports.plots]: best: unknown metric"]),
    "unknown search constraint metric": (
        BASE + '[search]\nkey = "workload.rate"\nlow = 1\nhigh = 8\nconstraint = "ttft_ms.p999 <= 200"\n',
        ["[search]: constraint: unknown metric 'ttft_ms.p999'"]),
    "an integer past Python's 4,300 digits": (BASE.replace("rate = 10", "rate = 1%s" % ("0" * 5000)),
                                               ["not valid TOML: Exceeds the limit (4300 digits)"]),
    "a search bound no float holds": (
        BASE + '[search]\nkey = "workload.rate"\nlow = 1\nhigh = 1%s\nconstraint = "ttft_ms.p99 <= 200"\n' % ("0" * 400),
        ["[search]: high: must be a finite number, got 10**400"]),
    "a results folder outside results/": (BASE.replace('name = "hostile"', 'name = "../../escape"'),
                                          ["name '../../escape' must be one folder name"]),
    "a name with a slash": (BASE.replace('name = "hostile"', 'name = "a/b"'), ["name 'a/b' must be one folder name"]),
    "a name that is ..": (BASE.replace('name = "hostile"', 'name = ".."'), ["name '..' must be one folder name"]),
    "a kind that is a table": (BASE + "[scheduler]\nkind = {a = 1}\n",
                               ["[scheduler]: a scheduler is named by text, got dict {'a': 1}; registered: "]),
    "a kind that is a list": (BASE.replace('kind = "synthetic"', "kind = []"),
                              ["[workload]: a workload is named by text, got list []; registered: ", "synthetic"]),
    "a class's SLO target too long for a float": (
        BASE + "[slo]\nclasses.default = {ttft_ms = 1%s}\n" % ("0" * 400),
        ["[slo]: classes: default.ttft_ms must be a finite number", "got 10**400"]),
    "a plan's price too long for a float": (
        BASE + '[cost_model]\nkind = "roofline"\nmodel = "llama-3-8b"\ngpu = "a100-40gb"\n[kv_cache]\nkind = "paged"\n'
        'model = "llama-3-8b"\ngpu = "a100-40gb"\n[plan]\nconstraints = ["ttft_ms.p99 <= 1000"]\n'
        "gpus = {l4 = 1%s}\n" % ("0" * 400),
        ["[plan]: gpus: l4: the price per GPU-hour must be a finite number > 0, got 10**400"]),
    "a plan's tensor_parallel past the bound": (
        BASE + '[cost_model]\nkind = "roofline"\nmodel = "llama-3-8b"\ngpu = "a100-40gb"\n[kv_cache]\nkind = "paged"\n'
        'model = "llama-3-8b"\ngpu = "a100-40gb"\n[plan]\nconstraints = ["ttft_ms.p99 <= 1000"]\n'
        "gpus = {l4 = 1}\ntensor_parallel = [1, 2000]\n",
        ["[plan]: tensor_parallel: must be <= 1024, got 1, 2000"]),
    "a tolerance on a whole-number search": (
        BASE + '[search]\nkey = "scheduler.max_num_seqs"\nlow = 1\nhigh = 8\ntolerance = 1\n'
        'constraint = "ttft_ms.p99 <= 200"\n',
        ["[search]: tolerance: scheduler.max_num_seqs takes whole numbers", "drop it"]),
    "settings that contradict each other": (BASE + "[scheduler]\nkind = \"vllm\"\nmax_num_seqs = 64\n"
                                            "max_num_batched_tokens = 32\n",
                                            ["[scheduler]: max_num_batched_tokens (32) must be >= max_num_seqs (64)"]),
    # found by fuzzing: each passed validate, then every request was rejected, or the run failed blaming arrival_ms
    "a watermark that keeps the whole cache": (BASE + "[scheduler]\nkind = \"continuous\"\nwatermark = 1.0\n",
                                               ["[scheduler]: watermark: must be < 1", "no request is ever admitted"]),
    "partitions of a single instance": (BASE + "[cluster]\npartitions = 5\n",
                                        ["[cluster]: partitions: 5 parts of a single instance: it has nothing to split"]),
    "a front end's handling past the clock": (BASE + "[frontend]\nrequest_ms = 1e13\n",
                                              ["[frontend]: request_ms: must be <= 1000000000000.0"]),
    "a tokenizer of 1e10 ms a token": (BASE + "[frontend]\ntokenize_ms_per_token = 1e10\n",
                                       ["[frontend]: tokenize_ms_per_token: must be <= 10000.0"]),
    # a NUL byte in a path: open() raises a bare ValueError -- a traceback (review s81 badinput, 3) or a
    # built-in plugin's crash naming no table (4)
    "a model config path with a NUL byte": (BASE + '[models.m]\nconfig = "r\\u0000.json"\n',
                                            ["[models.m]: config:", "holds a NUL byte (\\0), which no file name can"]),
    "a request file path with a NUL byte": ('[experiment]\nname = "hostile"\n[workload]\nkind = "file"\n'
                                            'path = "r\\u0000.json"\n',
                                            ["[workload]:", "holds a NUL byte (\\0), which no file name can"]),
    "a closed loop's pause past the clock": (
        BASE.replace('kind = "synthetic"\nnum_requests = 20', 'kind = "closed_loop"\nclients = 2\nnum_requests = 20')
        .replace('arrival = "poisson"\nrate = 10\n', "think_ms = 1e13\n"),
        ["[workload]: think_ms: must be <= 1000000000000.0"]),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_experiment_files_fail_in_one_line_before_running(tmp_path, capsys, case, command):
    text, fragments = FILE_CASES[case]
    code, err = run_file(tmp_path, capsys, text, command=command)
    one_error(code, err, *fragments)
    assert "run(s)" not in err  # refused while loading: nothing ran
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


RUN_CASES = {
    # sizes that only the run reveals (arrival times scaled by the rate, iteration costs)
    "Poisson rate 1e-300": (BASE.replace("rate = 10", "rate = 1e-300"),
                            ["run 'hostile'", "arrival times must be at most 1e+12 ms", "rate and time_scale"]),
    "decode step of 1e306 ms": (BASE + '[cost_model]\nkind = "linear"\ndecode_ms_per_step = 1e306\n',
                                ["run 'hostile'", "the simulated clock would pass 1e+12 ms", "1e+306 ms"]),
    "decode step of 1e308 ms": (BASE + '[cost_model]\nkind = "linear"\ndecode_ms_per_step = 1e308\n',
                                ["the simulated clock would pass 1e+12 ms"]),
    "prefill of 1e300 ms per token": (BASE + '[cost_model]\nkind = "linear"\nprefill_ms_per_token = 1e300\n',
                                      ["the simulated clock would pass 1e+12 ms"]),
    # each bound alone is kept, their sum is not: named as the front end's, not as "request 0: arrival_ms"
    "a front end's handling that ends past the clock": (
        BASE + "[frontend]\nrequest_ms = 1e12\ntokenize_ms_per_token = 1\n",
        ["run 'hostile'", "[frontend]: a request of 100 prompt tokens is handled for 1e+12 ms",
         "past the clock's end"]),
    "decode step of 1e306 ms, reference engine": (
        BASE.replace('name = "hostile"', 'name = "hostile"\nengine = "reference"')
        + '[cost_model]\nkind = "linear"\ndecode_ms_per_step = 1e306\n', ["the simulated clock would pass"]),
}


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_absurd_sizes_found_while_running_end_in_one_line(tmp_path, capsys, case):
    text, fragments = RUN_CASES[case]
    code, err = run_file(tmp_path, capsys, text)
    one_error(code, err, *fragments)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("command", ["run", "validate"])
def test_arrival_times_past_the_clock_in_a_request_file(tmp_path, capsys, command):
    """Refused where the file is read, naming its record: validate passed it, and run said 'check
    rate and time_scale', neither of them set."""
    (tmp_path / "far.json").write_text(json.dumps([{"prompt_tokens": 10, "output_tokens": 5, "arrival_ms": 0},
                                                   {"prompt_tokens": 10, "output_tokens": 5, "arrival_ms": 1e300}]))
    text = '[experiment]\nname = "far"\n[workload]\nkind = "file"\npath = "far.json"\n'
    one_error(*run_file(tmp_path, capsys, text, command=command),
              "far.json: record 2: arrival_ms: must be <= 1e+12 (ms: the simulated clock's end, about 31.7 years), "
              "got 1e+300")


def test_tiny_iteration_costs_are_one_error_not_a_traceback(tmp_path, capsys):
    """1e-300 ms iterations once overflowed the decode-run arithmetic (a traceback), then ran with a
    clock that did not move (every later step at the same time); an iteration must advance it."""
    text = BASE + '[cost_model]\nkind = "linear"\nprefill_ms_per_token = 1e-300\ndecode_ms_per_step = 1e-300\n'
    code, err = run_file(tmp_path, capsys, text)
    one_error(code, err, "cost model 'linear' (built-in plugin schedlab_plugins.cost_models) returned 1e-298 ms for "
              "Batch(", "which does not advance the simulated clock")
    small = BASE + '[cost_model]\nkind = "linear"\nprefill_ms_per_token = 1e-9\ndecode_ms_per_step = 1e-9\n'
    code, err = run_file(tmp_path, capsys, small)
    assert code == 0, err
    metrics = json.loads((tmp_path / "out" / "summary.json").read_text())["studies"][0]["runs"][0]["metrics"]
    assert metrics["finished"] == 20 and metrics["generated_tokens"] == 20 * 20


@pytest.mark.parametrize("content, fragments", [
    (bytes(range(256)), ["not a text file", "UTF-8"]),
    ("[experiment]\nname = 'caf\xe9'\n".encode("latin-1"), ["not a text file", "UTF-8"]),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_binary_and_non_utf8_files(tmp_path, capsys, content, fragments, command):
    path = tmp_path / "exp.toml"
    path.write_bytes(content)
    one_error(main([command, str(path)]), capsys.readouterr().err, str(path), *fragments)


@pytest.mark.parametrize("name", ["requests.json", "requests.jsonl", "requests.csv"])
def test_a_request_file_not_in_utf8_says_so(tmp_path, capsys, name):
    """Found by fuzzing: a .json file with bytes that are not UTF-8 was called 'a number too
    long to read' (json's UnicodeDecodeError is a ValueError too); .jsonl and .csv said it right."""
    body = {"requests.json": b'[{"prompt_tokens": 10, "output_tokens": 5, "x": "\xff\xfe"}]',
            "requests.jsonl": b'{"prompt_tokens": 10, "output_tokens": 5, "x": "\xff\xfe"}\n',
            "requests.csv": b"prompt_tokens,output_tokens,x\n10,5,\xff\xfe\n"}[name]
    (tmp_path / name).write_bytes(body)
    (tmp_path / "exp.toml").write_text(f'[experiment]\nname = "x"\n[workload]\nkind = "file"\npath = "{name}"\n')
    line = one_error(main(["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]),
                     capsys.readouterr().err, name, "not UTF-8 text")
    assert "too long" not in line


@pytest.mark.parametrize("top, extra, fragment", [
    ("slo = 5\n", (), "exp.toml: [slo]: must be a table, got 5"),
    ("[[slo]]\nttft_ms = 100\n", (), "exp.toml: [slo]: must be a table, got an array"),
    ("cluster = []\n", (), "exp.toml: [cluster]: must be a table, got an array"),   # (passed as no table)
    ("", ("--set", "scheduler=abc"), "--set scheduler: "),
    ("[[runs]]\nname = \"a\"\nsearch = 5\n", (), "exp.toml: [[runs]] 'a' [search]: must be a table, got 5"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_value_where_a_table_goes_is_named(tmp_path, capsys, command, top, extra, fragment):
    """slo = 5, [[slo]], --set scheduler=abc: a TypeError traceback from deep in the loader before."""
    code, err = run_file(tmp_path, capsys, top + BASE, *extra, command=command)
    one_error(code, err, fragment, "must be a table")


@pytest.mark.parametrize("study, table", [('[sweep]\n"nope.key" = [1, 2]\n', "sweep"),
                                          ('[search]\nkey = "abc"\nlow = 1\nhigh = 4\nconstraint = '
                                           '"ttft_ms.p99 <= 100"\n', "search")])
def test_a_study_key_outside_the_run_tables_names_the_file_and_table(tmp_path, capsys, study, table):
    """The message named the run alone ('hostile: cannot vary ...'), not the file or the table."""
    code, err = run_file(tmp_path, capsys, BASE + study, command="validate")
    one_error(code, err, f"exp.toml: [{table}]: cannot vary ", "keys start with one of workload")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_folder_given_as_the_experiment_file(tmp_path, capsys, command):
    one_error(main([command, str(tmp_path)]), capsys.readouterr().err, "is a folder; give the experiment's .toml file")


# -- --out -----------------------------------------------------------------------------------------------


def _out_cases(tmp_path: Path) -> dict:
    (tmp_path / "a_file").write_text("x")
    other = tmp_path / "someone_elses"
    other.mkdir()
    (other / "thesis.tex").write_text("do not delete")
    return {
        "an existing file": (tmp_path / "a_file", ["exists and is not a folder"]),
        "under a file": (tmp_path / "a_file" / "sub", ["a_file is a file, not a folder"]),
        "deep under a file": (tmp_path / "a_file" / "sub" / "deeper", ["a_file is a file, not a folder"]),
        "under /proc": (Path("/proc/schedlab-results"), ["cannot create the results folder there"]),
        "under /sys": (Path("/sys/schedlab-results"), ["cannot create the results folder there"]),
        "a 300-character name": (tmp_path / ("a" * 300), ["is too long for the file system"]),
        "/dev/null": (Path("/dev/null"), ["exists and is not a folder"]),
        "a folder with other files": (other, ["is a folder with other files in it"]),
    }


OUT_CASES = ["an existing file", "under a file", "deep under a file", "under /proc", "under /sys",
             "a 300-character name", "/dev/null", "a folder with other files"]


@pytest.mark.parametrize("case", OUT_CASES)
def test_unusable_out_fails_before_running(tmp_path, capsys, case):
    out, fragments = _out_cases(tmp_path)[case]
    if str(out).startswith(("/proc", "/sys")) and not Path(str(out)[:5]).is_dir():
        pytest.skip("no /proc or /sys here")
    code = main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)])
    err = capsys.readouterr().err
    one_error(code, err, f"--out {out}", *fragments)
    assert "run(s)" not in err  # refused before simulating anything
    assert (tmp_path / "someone_elses" / "thesis.tex").read_text() == "do not delete"
    assert not [p for p in tmp_path.rglob(".*") if p.name.endswith((".tmp", ".old"))]


# -- schedlab plot on files it did not write ---------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "qs"
    assert main(["run", str(QUICKSTART), "--no-plots", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("damage, fragments", [
    (lambda text: text[: len(text) // 2], ["summary.json: not valid JSON", "cut short"]),
    (lambda text: "", ["summary.json: not valid JSON"]),
    (lambda text: '{"name": "not ours", "rows": [1, 2, 3]}', ["not a schedlab summary.json", "'experiment'"]),
    (lambda text: "[1, 2, 3]", ["not a schedlab summary.json", "list, not an object"]),
    (lambda text: '{"experiment": "x", "studies": [{"name": "s", "kind": "run", "runs": [{"name": 3}]}]}',
     ["not a schedlab summary.json", "studies[0].runs[0] has no 'name'"]),
    (lambda text: text.replace('"metrics"', '"metricz"'), ["studies[0].runs[0] has no 'metrics'"]),
    (lambda text: json.dumps({**json.loads(text), "studies": [{**json.loads(text)["studies"][0], "plan": True}]}),
     ["not a schedlab summary.json", "studies[0].plan is true or false, not an object"]),
    # a summary.json of no studies or no runs drew 0 plots beside the rows, exit 0 (fuzz review s78)
    (lambda text: json.dumps({**json.loads(text), "studies": []}),
     ["requests.csv: has rows of run 'static' (and 1 more), which summary.json does not list"]),
    (lambda text: json.dumps({**json.loads(text), "studies": [{**json.loads(text)["studies"][0], "runs": []}]
                              + json.loads(text)["studies"][1:]}),
     ["requests.csv: has rows of run 'static', which summary.json does not list"]),
])
def test_plot_refuses_a_truncated_or_foreign_summary(saved, tmp_path, capsys, damage, fragments):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("summary.json", "requests.csv", "timeline.csv"):
        (folder / name).write_bytes((saved / name).read_bytes())
    (folder / "summary.json").write_text(damage((saved / "summary.json").read_text()))
    one_error(main(["plot", str(folder)]), capsys.readouterr().err, *fragments)


def test_plot_refuses_a_folder_without_its_request_rows(saved, tmp_path, capsys):
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / "summary.json").write_bytes((saved / "summary.json").read_bytes())
    (folder / "requests.csv").write_text("run,id\nstatic,not-a-number\n")
    one_error(main(["plot", str(folder)]), capsys.readouterr().err, "requests.csv: no column 'arrival_ms'")
    from schedlab.results.storage import REQUEST_COLUMNS

    row = ["not-a-number" if name == "id" else "static" if name == "run" else "" for name in REQUEST_COLUMNS]
    (folder / "requests.csv").write_text(",".join(REQUEST_COLUMNS) + "\n" + ",".join(row) + "\n")
    one_error(main(["plot", str(folder)]), capsys.readouterr().err, "requests.csv: run 'static': a row that does not "
              "read (invalid literal for int() with base 10: 'not-a-number')")


def _no_number_in_the_timeline(folder):
    header, first, *rest = (folder / "timeline.csv").read_text().splitlines()
    cells = first.split(",")
    cells[header.split(",").index("duration_ms")] = "abc"
    (folder / "timeline.csv").write_text("\n".join([header, ",".join(cells), *rest]) + "\n")


@pytest.mark.parametrize("damage, fragments", [
    (lambda folder: (folder / "timeline.csv").write_text(""), ["timeline.csv: empty, not even its header row"]),
    (lambda folder: (folder / "requests.csv").unlink(),
     ["requests.csv: cannot read the saved results (No such file or directory)"]),
    (_no_number_in_the_timeline, ["timeline.csv: run ", "could not convert string to float: 'abc'"]),
])
def test_plot_names_the_file_it_cannot_read(saved, tmp_path, capsys, damage, fragments):
    """Found by fuzzing: an empty timeline.csv said 'StopIteration', a missing requests.csv and a
    cell that is no number named no file."""
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("summary.json", "requests.csv", "timeline.csv"):
        (folder / name).write_bytes((saved / name).read_bytes())
    damage(folder)
    one_error(main(["plot", str(folder)]), capsys.readouterr().err, *fragments)


# -- capacity ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, value, fragment", [
    ("--activation-reserve-gib", "inf", "--activation-reserve-gib must be a finite number >= 0"),
    ("--activation-reserve-gib", "nan", "--activation-reserve-gib must be a finite number >= 0"),
    ("--gpu-memory-utilization", "inf", "--gpu-memory-utilization must be in (0, 1]"),
])
def test_capacity_refuses_non_finite_numbers(capsys, option, value, fragment):
    code = main(["capacity", "--model", "llama-3-8b", "--gpu", "a100-40gb", option, value])
    one_error(code, capsys.readouterr().err, fragment)


def test_capacity_says_a_folder_lacks_its_config_json(tmp_path, capsys):
    """Found by fuzzing: a folder without config.json was looked up as a preset's name."""
    one_error(main(["capacity", "--model", str(tmp_path), "--gpu", "a100-80gb"]), capsys.readouterr().err,
              f"--model {tmp_path}: a folder without a config.json")


# -- plugins that break ----------------------------------------------------------------------------------------


def _cli(*args, env_path: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = None
    if env_path is not None:
        import os

        env = dict(os.environ, PYTHONPATH=str(env_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "schedlab", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("body, fragment", [
    ("raise RuntimeError('boom while importing')\n", "failed while importing: RuntimeError: boom while importing "
                                                     "(exiting_plugin.py:1)"),
    ("x = 1\nimport json\nd = {}\nd['k']\n", "failed while importing: KeyError: 'k' (exiting_plugin.py:4)"),
    ("import not_a_module_xyz\n", "cannot import plugin module 'exiting_plugin': No module named "
                                  "'not_a_module_xyz' (exiting_plugin.py:1)"),
    ("raise BaseException('base')\n", "failed while importing: BaseException: base (a plugin module must not exit"),
    ("import sys\nsys.exit(3)\n", "failed while importing: SystemExit: 3"),
])
def test_a_plugin_module_that_raises_or_exits_at_import_is_named(tmp_path, capsys, monkeypatch, body, fragment):
    (tmp_path / "exiting_plugin.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = BASE.replace('name = "hostile"', 'name = "hostile"\nplugins = ["exiting_plugin"]')
    try:
        code, err = run_file(tmp_path, capsys, text, command="validate")
    finally:
        sys.modules.pop("exiting_plugin", None)
    one_error(code, err, "exp.toml: [experiment] plugins: " + (fragment if fragment.startswith("cannot") else
                                                                "plugin module 'exiting_plugin' " + fragment))


@pytest.mark.parametrize("name, fragment", [
    ("", "'' is not a module name"),
    ("../x", "'../x' is not a module name"),
    ("json", "plugin module 'json' implements no schedlab hook"),
])
def test_plugin_module_names_that_cannot_be_plugins_name_the_file_and_key(tmp_path, capsys, name, fragment):
    text = BASE.replace('name = "hostile"', f'name = "hostile"\nplugins = ["{name}"]')
    code, err = run_file(tmp_path, capsys, text, command="validate")
    one_error(code, err, "exp.toml: [experiment] plugins: " + fragment)


@pytest.mark.parametrize("args, fragment", [
    (["capacity", "--model", "llama-3-8b", "--gpu", "a100-40gb", "--tensor-parallel", "x"],
     "schedlab capacity: argument --tensor-parallel: invalid int value: 'x' (see schedlab capacity --help)"),
    (["bogus"], "schedlab: error: argument command: invalid choice: 'bogus'"),   # (schedlab named once)
    (["run"], "schedlab run: the following arguments are required: file"),
])
def test_a_misused_option_is_one_line_too(capsys, args, fragment):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    one_error(exit_.value.code, capsys.readouterr().err, fragment)


@pytest.mark.parametrize("target, fragment", [("folder", "is a folder, not a file"),
                                              ("/dev/zero", "is a character device, not a regular file")])
def test_a_calibration_target_that_is_no_file_says_what_it_is(tmp_path, capsys, target, fragment):
    path = tmp_path if target == "folder" else Path(target)
    code = main(["calibrate", str(QUICKSTART), "--target", str(path), "--fit", "cost_model.mfu=0.1:0.9"])
    one_error(code, capsys.readouterr().err, f"--target {path}: {fragment}")


@pytest.mark.parametrize("rows, fragment", [
    ("prompt_tokens,output_tokens\n10,1000000000\n",
     "requests.csv: line 2: output_tokens: must be <= 10**8, got 10**9"),
    ("prompt_tokens,output_tokens,max_tokens\n10,5,100000000000\n",
     "requests.csv: line 2: max_tokens: must be <= 10**8"),
    ("x" * 200_000 + ",output_tokens\n10,5\n", "requests.csv: line 1: bad CSV header: field larger than field limit"),
])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_request_file_past_the_bounds_is_refused_where_it_is_read(tmp_path, capsys, rows, fragment, command):
    (tmp_path / "requests.csv").write_text(rows)
    text = BASE.replace('kind = "synthetic"', 'kind = "file"\npath = "requests.csv"').replace(
        "num_requests = 20\n", "").replace('prompt = {dist = "fixed", value = 100}\n', "").replace(
        'output = {dist = "fixed", value = 20}\n', "").replace('arrival = "poisson"\n', "").replace("rate = 10\n", "")
    code, err = run_file(tmp_path, capsys, text, command=command)
    one_error(code, err, fragment)


def test_a_model_config_in_a_symlink_loop_is_named(tmp_path, capsys):
    (tmp_path / "config.json").symlink_to(tmp_path / "other.json")
    (tmp_path / "other.json").symlink_to(tmp_path / "config.json")
    code = main(["capacity", "--model", str(tmp_path / "config.json"), "--gpu", "a100-40gb"])
    one_error(code, capsys.readouterr().err, "config.json", "symbolic links")


def test_a_hunt_range_no_float_holds_is_named(tmp_path, capsys):
    text = textwrap.dedent("""
        [experiment]
        name = "h"
        [[runs]]
        name = "a"
        [[runs]]
        name = "b"
        [hunt]
        objective = "runs.a.ttft_ms.p99 / runs.b.ttft_ms.p99"
        [hunt.workload]
        requests = [2, 40]
        rate = [0.5, 1%s]
        prompt = [16, 1%s]
        output = [1, 500]
        """ % ("0" * 400, "0" * 400))
    path = tmp_path / "hunt.toml"
    path.write_text(text)
    one_error(main(["validate", str(path)]), capsys.readouterr().err,
              "[hunt.workload]: rate: must be finite numbers (at most 1.8e+308), got [0.5, 10**400]")
    path.write_text(text.replace("rate = [0.5, 1%s]" % ("0" * 400), "rate = [0.5, 16]"))
    one_error(main(["validate", str(path)]), capsys.readouterr().err,
              "[hunt.workload]: prompt: must be >= 1 and <= 1e+08, got [16, 10**400]")


def test_a_registration_hook_that_raises_is_named(tmp_path, capsys, monkeypatch):
    (tmp_path / "buggy_plugin.py").write_text(textwrap.dedent("""
        import schedlab

        @schedlab.hookimpl
        def schedlab_register_schedulers(register):
            register("buggy", None, config=dict)   # a dict is not an attrs class
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    text = BASE.replace('name = "hostile"', 'name = "hostile"\nplugins = ["buggy_plugin"]')
    try:
        code, err = run_file(tmp_path, capsys, text, command="validate")
    finally:
        sys.modules.pop("buggy_plugin", None)
    one_error(code, err, "plugin buggy_plugin failed in schedlab_register_schedulers: TypeError")


@pytest.fixture
def broken_install(tmp_path):
    """A folder on PYTHONPATH holding two installed packages with ``schedlab`` entry points:
    one raises when imported, one implements a hook that does not exist."""
    (tmp_path / "broken_sched.py").write_text("raise ImportError('needs torch, which is not installed')\n")
    (tmp_path / "misspelt_hooks.py").write_text(textwrap.dedent("""
        import schedlab

        @schedlab.hookimpl
        def schedlab_register_schedulerz(register):
            pass
        """))
    for package, module in (("broken-sched", "broken_sched"), ("misspelt-hooks", "misspelt_hooks")):
        dist = tmp_path / f"{module}-0.3.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.3\n")
        (dist / "entry_points.txt").write_text(f"[schedlab]\n{module} = {module}\n")
    return tmp_path


@pytest.mark.parametrize("args", [["plugins"], ["validate", str(QUICKSTART)],
                                  ["capacity", "--model", "llama-3-8b", "--gpu", "l4"]])
def test_a_broken_installed_plugin_is_named_and_left_out(broken_install, args):
    done = _cli(*args, env_path=broken_install)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("schedlab: warning: ")]
    assert len(warnings) == 2, done.stderr
    assert any("plugin 'broken_sched' of package broken-sched 0.3" in w and "left out" in w
               and "ImportError: needs torch" in w for w in warnings), warnings
    assert any("plugin 'misspelt_hooks' of package misspelt-hooks 0.3" in w and "schedlab_register_schedulerz" in w
               for w in warnings), warnings
    if args == ["plugins"]:
        assert "  continuous " in done.stdout


# -- hangs -------------------------------------------------------------------------------------------------------

CLOSED_LOOP = """
[experiment]
name = "loop"
[workload]
kind = "closed_loop"
clients = 2
duration_ms = 1000
prompt = {dist = "fixed", value = 50000}
output = {dist = "fixed", value = 20}
"""


@pytest.mark.parametrize("case, text, fragment", [
    ("time_scale 1e30", None, "with time_scale = 1e+30 the last request arrives at 4e+31 ms, past the simulated "
                              "clock's end"),
    ("instances 10**30", BASE + "[cluster]\ninstances = 1" + "0" * 30 + "\n", "instances: must be <= 1024"),
    ("instances 100,000", BASE + "[cluster]\ninstances = 100000\n", "instances: must be <= 1024"),
    # a closed loop bounded by time alone, every request turned away on arrival, no pause: each
    # rejection sent the next request at the same instant, for ever
    ("closed loop turned away", CLOSED_LOOP + '[kv_cache]\nkind = "paged"\nnum_blocks = 10\n',
     "client 0's last 10,000 requests were each turned away the moment it arrived, at t = 0 ms"),
    ("closed loop over TGI's limit", CLOSED_LOOP.replace("50000", "50").replace("clients = 2", "clients = 4")
     + '[scheduler]\nkind = "tgi"\nmax_concurrent_requests = 1\n', "with think_ms = 0 it sent the next at once"),
])
def test_what_used_to_hang_ends_with_an_error(tmp_path, case, text, fragment):
    """Once: spinning in the decode-run arithmetic, or building 10**30 instances. The timeout is
    a guard that turns a hang into a failure, not a speed requirement."""
    if text is None:
        (tmp_path / "r.json").write_text(json.dumps([{"prompt_tokens": 10, "output_tokens": 500, "arrival_ms": i * 10}
                                                     for i in range(5)]))
        text = '[experiment]\nname = "slow"\n[workload]\nkind = "file"\npath = "r.json"\ntime_scale = 1e30\n'
    (tmp_path / "exp.toml").write_text(text)
    done = _cli("run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out"), timeout=300)
    one_error(done.returncode, done.stderr, fragment)


def test_loading_builds_one_instance_of_plugins_running_builds_each(tmp_path):
    """100,000 instances once built every plugin twice over before the run started."""
    import schedlab
    from schedlab.study.experiment import load, run_experiment
    from schedlab_plugins.schedulers import StaticConfig, StaticScheduler

    built = []

    class Counting:
        @schedlab.hookimpl
        def schedlab_register_schedulers(self, register):
            register("counted", lambda config: built.append(1) or StaticScheduler(config), config=StaticConfig)

    path = tmp_path / "exp.toml"
    path.write_text(BASE + '[scheduler]\nkind = "counted"\n[cluster]\ninstances = 8\n')
    exp = load(path, plugin_objects=[Counting()])
    assert len(built) == 1
    run_experiment(exp)
    assert len(built) == 1 + 8


# -- request files with numbers beyond any column -----------------------------------------------------

HUGE = {"10**30": "1" + "0" * 30, "1e30": "1e30", "'1e30'": '"1e30"', "2**63": str(2**63)}


def request_file(fmt: str, value: str) -> str:
    if fmt == "json":
        return json.dumps({"requests": [{"prompt_tokens": 10, "output_tokens": 5, "arrival_ms": 0}]})[:-2] + (
            f', {{"prompt_tokens": {value}, "output_tokens": 5, "arrival_ms": 1}}]}}')
    if fmt == "jsonl":
        return ('{"prompt_tokens": 10, "output_tokens": 5, "arrival_ms": 0}\n'
                f'{{"prompt_tokens": {value}, "output_tokens": 5, "arrival_ms": 1}}\n')
    return f"prompt_tokens,output_tokens,arrival_ms\n10,5,0\n{value.strip(chr(34))},5,1\n"


@pytest.mark.parametrize("value", list(HUGE), ids=list(HUGE))
@pytest.mark.parametrize("fmt, where", [("json", "record 2"), ("jsonl", "line 2"), ("csv", "line 3")])
def test_a_token_count_beyond_int64_names_its_record(tmp_path, capsys, value, fmt, where):
    """10**30, 1e30 or "1e30" as a prompt length ended in an OverflowError traceback; it is refused
    naming the field's own bound (it named the int64 range, which is not the limit: review s80)."""
    (tmp_path / f"r.{fmt}").write_text(request_file(fmt, HUGE[value]))
    text = f'[experiment]\nname = "h"\n[workload]\nkind = "file"\npath = "r.{fmt}"\n'
    code, err = run_file(tmp_path, capsys, text)
    one_error(code, err, f"r.{fmt}: {where}: prompt_tokens: must be <= 10**8, got")


@pytest.mark.parametrize("key", ["path", "prompts"])
def test_an_empty_path_is_refused_by_name(tmp_path, capsys, key):
    """--set 'workload.prompts=""' answered '<folder>: file not found'."""
    path = tmp_path / "exp.toml"
    path.write_text('[experiment]\nname = "h"\n[workload]\nkind = "vllm_log"\npath = "log.jsonl"\n')
    code = main(["run", str(path), "--set", f'workload.{key}=""'])
    one_error(code, capsys.readouterr().err, f"[workload]: {key}: must be a path, got an empty string")


# -- numbers too long for a float, and sizes that overflowed ---------------------------------------------------

LONG = "1" + "0" * 400          # 10**400: TOML and JSON take it; float() raised OverflowError


@pytest.mark.parametrize("text, fragment", [
    (BASE.replace("rate = 10", f"rate = {LONG}"), "[workload]: rate: must be a finite number (at most 1.8e+308), "
                                                  "got 10**400"),
    (BASE.replace("rate = 10", f"rate = {LONG}1"), "[workload]: rate: must be a finite number (at most 1.8e+308), "
                                                   "got 1.00e+401"),
    (BASE + f"[slo]\nttft_ms = {LONG}\n", "[slo]: ttft_ms: must be a finite number (at most 1.8e+308), got 10**400"),
    (BASE + f'[scheduler]\nkind = "vllm"\nwatermark = {LONG}\n', "[scheduler]: watermark: must be <= 1.0, got 10**400"),
    (BASE + f'[cost_model]\nkind = "linear"\ndecode_ms_per_step = {LONG}\n',
     "[cost_model]: decode_ms_per_step: must be a finite number (at most 1.8e+308), got 10**400"),
    (BASE.replace('{dist = "fixed", value = 20}', f'{{dist = "lognormal", median = {LONG}, sigma = 1}}'),
     "[workload]: output: median must be a number > 0 and <= 1e+08, got 10**400"),
    (BASE.replace("num_requests = 20\n", "").replace("rate = 10", "stages = [{rate = 1e300, duration_s = 1e300}]"),
     "[workload]: stages: stage 1: rate x duration_s = inf requests, more than 10000000"),
    (BASE.replace("value = 20}", "value = 20}\noutput_scale = 1e300"), "[workload]: output_scale: must be <= 10**8, "
                                                                       "got 1e+300"),
], ids=["rate", "rate 10**401", "slo", "watermark", "decode step", "lognormal median", "stages", "output_scale"])
def test_a_setting_too_long_for_a_float_is_named(tmp_path, capsys, text, fragment):
    """A 400-digit number for a real-valued setting ended in 'OverflowError: int too large to
    convert to float'; output_scale = 1e300 in a numpy overflow warning and an int64 wrapped to
    -2**63; stages of 1e300 x 1e300 in 'cannot convert float infinity to integer'."""
    code, err = run_file(tmp_path, capsys, text, command="validate")
    one_error(code, err, fragment)


def test_a_set_override_too_long_for_a_float_is_named(tmp_path, capsys):
    code, err = run_file(tmp_path, capsys, BASE, "--set", f"workload.rate={LONG}")
    one_error(code, err, "[workload]: rate: must be a finite number (at most 1.8e+308), got 10**400")
    assert not (tmp_path / "out").exists()


def _huge_arrival_files(tmp_path: Path) -> dict:
    row = {"prompt_tokens": 5, "output_tokens": 5}
    (tmp_path / "r.json").write_text(f'[{{"prompt_tokens": 5, "output_tokens": 5, "arrival_ms": {LONG}}}]')
    (tmp_path / "r.jsonl").write_text(json.dumps({**row, "arrival_ms": 0}) + "\n"
                                      + f'{{"prompt_tokens": 5, "output_tokens": 5, "arrival_ms": {LONG}}}\n')
    (tmp_path / "m.jsonl").write_text(f'{{"timestamp": {LONG}, "input_length": 5, "output_length": 5, '
                                      '"hash_ids": [1]}\n')
    (tmp_path / "log.jsonl").write_text(f'{{"input_toks": 5, "output_toks": 5, "queued_ts": {LONG}, '
                                        '"first_token_ts": 1, "last_token_ts": 2}\n')
    shown = LONG[:57] + "..."
    return {
        "json": ('kind = "file"\npath = "r.json"', f"r.json: record 1: arrival_ms: must be a number >= 0, got {shown}"),
        "jsonl": ('kind = "file"\npath = "r.jsonl"',
                  f"r.jsonl: line 2: arrival_ms: must be a number >= 0, got {shown}"),
        "inline": (f"kind = \"inline\"\nrequests = [{{prompt_tokens = 5, output_tokens = 5, arrival_ms = {LONG}}}]",
                   f"[workload]: requests: record 1: arrival_ms: must be a number >= 0, got {shown}"),
        "mooncake": ('kind = "mooncake"\npath = "m.jsonl"', f"m.jsonl: line 1: timestamp: must be a number >= 0, "
                                                            f"got {shown}"),
        "vllm_log": ('kind = "vllm_log"\npath = "log.jsonl"', f"log.jsonl: line 1: queued_ts: must be a number, "
                                                              f"got {shown}"),
    }


@pytest.mark.parametrize("case", ["json", "jsonl", "inline", "mooncake", "vllm_log"])
def test_a_time_too_long_for_a_float_in_a_request_file_names_its_row(tmp_path, capsys, case):
    workload, fragment = _huge_arrival_files(tmp_path)[case]
    code, err = run_file(tmp_path, capsys, f'[experiment]\nname = "h"\n[workload]\n{workload}\n', command="validate")
    one_error(code, err, fragment)


def _config_json(folder: Path, **changes) -> Path:
    folder.mkdir()
    config = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, **changes}
    (folder / "config.json").write_text(json.dumps(config).replace('"HUGE"', LONG))
    return folder


def test_a_config_json_with_a_400_digit_width_is_named(tmp_path, capsys):
    folder = _config_json(tmp_path / "huge", hidden_size="HUGE")
    one_error(main(["capacity", "--model", str(folder), "--gpu", "a100-40gb"]), capsys.readouterr().err,
              "config.json: hidden_size: expected a whole number below 2**63 (64 bits), got 10**400")
    text = BASE + f'[models.mine]\nconfig = "{folder / "config.json"}"\n[kv_cache]\nkind = "paged"\nmodel = "mine"\n' \
                  'gpu = "a100-40gb"\n'
    one_error(*run_file(tmp_path, capsys, text, command="validate"),
              "[models.mine]: ", "hidden_size: expected a whole number below 2**63 (64 bits), got 10**400")


@pytest.mark.parametrize("option, value, fragment", [
    ("--activation-reserve-gib", "1e300", "--activation-reserve-gib must be a finite number >= 0 and <= 2**20 (GiB), "
                                          "got 1e+300"),
    ("--tensor-parallel", "1000000000000",
     "--tensor-parallel must be a whole number from 1 to 1024, got 1000000000000"),
    ("--block-size", "100000", "--block-size must be a whole number from 1 to 4096, got 100000"),
])
def test_capacity_refuses_sizes_beyond_the_experiment_files_bounds(capsys, option, value, fragment):
    """1e300 GiB of reserve ended in an OverflowError; 10**12-way tensor parallelism printed
    '14.96 -> 0.00 GiB of weights' and 100,000-token blocks a pool TOML refuses."""
    code = main(["capacity", "--model", "llama-3-8b", "--gpu", "a100-40gb", option, value])
    one_error(code, capsys.readouterr().err, fragment)


def test_capacity_with_a_p99_below_the_average_says_so(capsys):
    """With --avg-tokens 8000 --p99-tokens 100 it said 'p99-length sequences fit as many as
    average ones (1429)' though 20 average ones fit: 10,005 blocks // 500 = 20, // 7 = 1429."""
    code = main(["capacity", "--model", "llama-3-8b", "--gpu", "a100-40gb", "--avg-tokens", "8000",
                 "--p99-tokens", "100"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.strip().split("\n")[-1] == ("  plan for the average: the p99 length (100) is below the average (8000); "
                                           "1429 p99-length sequences fit, but only 20 average ones")


KV = '[kv_cache]\nkind = "paged"\nmodel = "llama-3-8b"\ngpu = "a100-40gb"\n'


@pytest.mark.parametrize("text, fragment", [
    (BASE + KV + "activation_reserve_gib = 1e300\n",
     "[kv_cache]: activation_reserve_gib: must be <= 2**20, got 1e+300"),
    (BASE + KV + "swap_space_gib = 1e300\n", "[kv_cache]: swap_space_gib: must be <= 2**20, got 1e+300"),
    (BASE + KV + "tensor_parallel = 1048576\n", "[kv_cache]: tensor_parallel: must be <= 1024, got 2**20"),
    (BASE + '[gpus.g]\nmemory_gib = 1e300\nhbm_bandwidth_gbps = 2000\nbf16_tflops = 300\nhost_link_gbps = 25\n'
     + KV.replace('"a100-40gb"', '"g"'), "[gpus.g]: memory_gib: must be <= 2**20, got 1e+300"),
    (BASE + '[models.m]\nnum_layers = 32\nnum_kv_heads = 8\nhead_dim = 128\nnum_params = 1.7e308\n',
     "[models.m]: num_params: must be <= 10**15, got 1.7e+308"),
], ids=["activation reserve", "swap space", "tensor parallel", "gpu memory", "parameters"])
def test_memory_sizes_that_overflowed_are_bounded(tmp_path, capsys, text, fragment):
    """Each ended in 'cannot convert float infinity to integer' or 'cannot convert float NaN to
    integer' while the pool was sized."""
    one_error(*run_file(tmp_path, capsys, text, command="validate"), fragment)


MODEL = "[models.m]\nnum_layers = 32\nhead_dim = 128\nnum_params = 8e9\n"
GPU = "[gpus.g]\nmemory_gib = 80\nhbm_bandwidth_gbps = 2000\nbf16_tflops = 300\nhost_link_gbps = 25\n"


@pytest.mark.parametrize("table, fragment", [
    (MODEL + "num_attention_heads = 32\nnum_kv_heads = 64\n", "[models.m]: m: num_kv_heads (64) exceeds "
                                                               "num_attention_heads (32)"),
    (MODEL + "num_attention_heads = 32\nnum_kv_heads = 12\n",
     "[models.m]: m: num_attention_heads (32) must be a multiple of num_kv_heads (12): each KV head serves a whole "
     "group of query heads"),
    (MODEL + "num_kv_heads = 8\nexperts_per_token = 2\n",
     "[models.m]: m: experts_per_token is set but num_experts is 0 (a dense model); give num_experts for a "
     "mixture-of-experts model"),
    (GPU + "min_clock_mhz = 2000\nmax_clock_mhz = 1000\n", "[gpus.g]: g: min_clock_mhz (2000) exceeds max_clock_mhz "
                                                           "(1000)"),
    (GPU + "board_w = 300\nidle_w = 400\n", "[gpus.g]: g: idle_w (400) exceeds board_w (300), the most the GPU draws"),
], ids=["more KV heads than heads", "heads not in groups", "experts of a dense model", "clocks", "idle power"])
def test_custom_models_and_gpus_that_cannot_exist_are_refused(tmp_path, capsys, table, fragment):
    one_error(*run_file(tmp_path, capsys, BASE + table, command="validate"), fragment)


def test_sjf_with_a_huge_prediction_error_runs_in_prediction_order(tmp_path, capsys):
    """prediction_sigma = 1000 overflowed exp(sigma * z) inside a worker (math range error)."""
    from schedlab.model import Request
    from schedlab_plugins.schedulers import LengthPredictor

    predict = LengthPredictor(1000.0, seed=3)
    requests = [Request(i, 0.0, 1, 10) for i in range(50)]
    logs = [predict.log_length(r) for r in requests]
    assert all(math.isfinite(v) for v in logs)
    lengths = [predict(r) for r in requests]
    assert 0.0 in lengths and math.inf in lengths     # exp(1000 z) leaves the float range both ways
    z = [np.random.default_rng((3, r.id)).standard_normal() for r in requests]
    assert sorted(range(50), key=lambda i: logs[i]) == sorted(range(50), key=lambda i: z[i])
    text = BASE + '[scheduler]\nkind = "vllm"\npolicy = "sjf"\nprediction_sigma = 1000\n'
    code, err = run_file(tmp_path, capsys, text)
    assert code == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["studies"][0]["runs"][0]["metrics"]["finished"] == 20


# -- request files that are not regular files, or JSON Python cannot read -----------------------------------------


def test_a_fifo_as_the_request_file_is_refused_without_blocking(tmp_path):
    """Reading a named pipe blocked until a writer came: for ever. The timeout is a guard that
    turns a hang into a failure, not a speed requirement."""
    os.mkfifo(tmp_path / "r.jsonl")
    (tmp_path / "exp.toml").write_text('[experiment]\nname = "f"\n[workload]\nkind = "file"\npath = "r.jsonl"\n')
    done = _cli("validate", str(tmp_path / "exp.toml"), timeout=120)
    one_error(done.returncode, done.stderr, f"{tmp_path / 'r.jsonl'}: is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("workload", ['kind = "file"\npath = "/dev/null"\nformat = "jsonl"',
                                      'kind = "vllm_bench"\npath = "/dev/null"'], ids=["file", "vllm_bench"])
def test_a_device_as_the_request_file_is_refused(tmp_path, capsys, workload):
    """/dev/zero as a JSONL file was read until the process was killed (24 GB); /dev/null stands
    for it here (a character device too, but one that ends)."""
    text = f'[experiment]\nname = "f"\n[workload]\n{workload}\n'
    one_error(*run_file(tmp_path, capsys, text, command="validate"),
              "/dev/null: is a character device, not a regular file")


def test_a_fifo_as_a_models_config_json_is_refused(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "config.json")
    one_error(main(["capacity", "--model", str(tmp_path / "m"), "--gpu", "a100-40gb"]), capsys.readouterr().err,
              f"--model: config: {tmp_path / 'm' / 'config.json'} is a FIFO (named pipe), not a regular file")


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("name, content, where", [
    ("r.json", DEEP, "r.json: bad JSON: lists or objects nested too deeply to read"),
    ("r.jsonl", '{"prompt_tokens": 5, "output_tokens": 5}\n' + DEEP + "\n",
     "r.jsonl: line 2: bad JSON: lists or objects nested too deeply to read"),
    # inside an object pyarrow's parser took the line, and recursed until the process crashed (a segfault)
    ("r.jsonl", '{"prompt_tokens": 5, "output_tokens": 5, "x": ' + DEEP + "}\n",
     "r.jsonl: line 1: bad JSON: lists or objects nested too deeply to read"),
    ("r.jsonl", '{"prompt_tokens": 5, "output_tokens": 5, "arrival_ms": ' + "1" * 5000 + "}\n",
     "r.jsonl: line 1: bad JSON: a number too long to read (more than 4300 digits)"),
], ids=["deep json", "deep jsonl line", "deep value in a jsonl object", "a 5000-digit number"])
def test_json_python_cannot_read_names_the_file(tmp_path, name, content, where):
    """RecursionError and 'Exceeds the limit (4300 digits)' tracebacks; a subprocess, since the
    deep line once crashed the process itself."""
    (tmp_path / name).write_text(content)
    (tmp_path / "exp.toml").write_text(f'[experiment]\nname = "f"\n[workload]\nkind = "file"\npath = "{name}"\n')
    done = _cli("validate", str(tmp_path / "exp.toml"))
    one_error(done.returncode, done.stderr, where)


def test_a_deeply_nested_config_json_is_named(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(DEEP)
    one_error(main(["capacity", "--model", str(tmp_path / "m"), "--gpu", "a100-40gb"]), capsys.readouterr().err,
              "is not JSON: lists or objects nested too deeply to read")


# -- Azure timestamps ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["1", "1700000000", "0.5", "2023", "2023-11-16", "2023-11-16 18:15:46+0:00",
                                   "2023-11-16 18:15:46 UTC", "now", "0999-01-01 00:00:00", "9999-01-01 00:00:00",
                                   LONG], ids=lambda stamp: stamp if len(stamp) < 30 else "10**400")
def test_an_azure_timestamp_that_is_not_a_date_and_time_is_refused(tmp_path, capsys, stamp):
    """Numbers were read as years ('0' as 1753 after wrapping round, '1700000000' as 2252),
    'now' read the clock: all with exit status 0. (A time zone Z, +hh:mm or -hh:mm is read: the
    Azure 2024 traces carry '+00:00'; other forms of one are refused.)"""
    (tmp_path / "az.csv").write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,20\n"
                                     f"{stamp},50,10\n")
    text = '[experiment]\nname = "a"\n[workload]\nkind = "azure"\npath = "az.csv"\n'
    shown = repr(stamp) if len(stamp) < 60 else repr(stamp)[:57] + "..."
    one_error(*run_file(tmp_path, capsys, text, command="validate"),
              "az.csv: line 3: timestamp (column 'TIMESTAMP'): not a date and time like '2023-11-16 18:17:03.9799600' "
              "or '2024-05-10 00:00:00.009930+00:00' (time zone Z, +hh:mm or -hh:mm if any; years 1678-2261), "
              f"got {shown}")


def test_azure_timestamps_in_their_own_forms_are_read_to_the_nanosecond(tmp_path):
    from schedlab_plugins.workloads.traces import load_azure

    (tmp_path / "az.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,20\n"
                                     "2023-11-16T18:15:47,50,10\n2023-11-16 18:15:47.000000001,5,1\n")
    arrival, _, _ = load_azure(tmp_path / "az.csv")
    assert arrival.tolist() == [0.0, 319.41, 319.410001]


def test_a_zipf_exponent_beyond_the_float_range_puts_every_request_in_group_0(tmp_path):
    """zipf_s = 1e300 printed numpy's 'RuntimeWarning: overflow encountered in power'."""
    import warnings

    from schedlab_plugins.workloads.synthetic import group_weights

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert group_weights(3, "zipf", 1e300).tolist() == [1.0, 0.0, 0.0]   # 1 / 2**1e300 = 0
    text = BASE.replace('kind = "synthetic"', 'kind = "shared_prefix"\nnum_groups = 3\nprefix_tokens = 10\n'
                                              'popularity = "zipf"\nzipf_s = 1e300').replace("prompt =", "suffix =")
    (tmp_path / "exp.toml").write_text(text)
    done = _cli("run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out"), "--no-plots")
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr


def test_vllm_log_timestamps_beyond_the_clock_are_refused_without_a_numpy_warning(tmp_path):
    """queued_ts = 1.7e308 printed 'RuntimeWarning: overflow encountered in multiply' before its error."""
    (tmp_path / "log.jsonl").write_text(
        '{"input_toks": 5, "output_toks": 5, "queued_ts": 0, "first_token_ts": 1, "last_token_ts": 2}\n'
        '{"input_toks": 5, "output_toks": 5, "queued_ts": 1.7e308, "first_token_ts": 1.7e308, '
        '"last_token_ts": 1.7e308}\n')
    (tmp_path / "exp.toml").write_text('[experiment]\nname = "v"\n[workload]\nkind = "vllm_log"\npath = "log.jsonl"\n')
    done = _cli("validate", str(tmp_path / "exp.toml"))
    one_error(done.returncode, done.stderr, "log.jsonl: the timestamps span 1.7e+308 s from the earliest arrival, more "
                                            "than the simulated clock's 1e+12 ms (about 31.7 years)")
    # an absurd arrival_time: said as such, not first warned of as a wait of 1e300 s for the engine loop
    (tmp_path / "log.jsonl").write_text(
        '{"input_toks": 5, "output_toks": 5, "arrival_time": 0, "queued_ts": 0, "first_token_ts": 1, '
        '"last_token_ts": 2}\n{"input_toks": 5, "output_toks": 5, "arrival_time": 1e300, "queued_ts": 1, '
        '"first_token_ts": 2, "last_token_ts": 3}\n')
    done = _cli("validate", str(tmp_path / "exp.toml"))
    one_error(done.returncode, done.stderr, "log.jsonl: the timestamps span 1e+300 s from the earliest arrival, more "
                                            "than the simulated clock's 1e+12 ms (about 31.7 years)")


@pytest.mark.parametrize("workload, message", [
    ('kind = "synthetic"\nnum_requests = 5\nprompt = {dist = "fixed", value = 5}\n'
     'output = {dist = "fixed", value = 5}\nrate = 5e-324',
     "arrival times must be at most 1e+12 ms (about 31.7 years), the end of the simulated clock; the last is inf ms "
     "(check rate and time_scale)"),
    # (refused when the file is read, since the arrivals in the file are checked there)
    ('kind = "vidur"\npath = "v.csv"\ntime_scale = 1e300', "v.csv: with time_scale = 1e+300 the last request may "
                                                           "arrive at inf ms, past the simulated clock's end"),
    ('kind = "file"\npath = "v.json"\ntime_scale = 1e300', "v.json: with time_scale = 1e+300 the last request "
                                                           "arrives at inf ms, past the simulated clock's end"),
], ids=["rate 5e-324", "vidur time_scale", "file time_scale"])
def test_arrivals_beyond_the_float_range_are_past_the_clock_without_a_numpy_warning(tmp_path, workload, message):
    """They printed 'RuntimeWarning: overflow encountered in multiply' (or divide), then 'arrival
    times must be finite and >= 0' though nothing in the file was infinite."""
    (tmp_path / "v.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,5\n1e8,5,5\n")
    (tmp_path / "v.json").write_text('[{"prompt_tokens": 5, "output_tokens": 5, "arrival_ms": 1e11}]')
    (tmp_path / "exp.toml").write_text(f'[experiment]\nname = "v"\n[workload]\n{workload}\n')
    done = _cli("run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out"))
    one_error(done.returncode, done.stderr, message)


def test_an_experiment_file_that_is_a_fifo_or_a_device_is_refused_without_blocking(tmp_path, capsys):
    """schedlab validate /dev/zero read until the out-of-memory killer came; a FIFO blocked."""
    os.mkfifo(tmp_path / "exp.toml")
    done = _cli("validate", str(tmp_path / "exp.toml"), timeout=120)
    one_error(done.returncode, done.stderr, f"{tmp_path / 'exp.toml'}: is a FIFO (named pipe), not a regular file")
    one_error(main(["validate", "/dev/null"]), capsys.readouterr().err,
              "/dev/null: is a character device, not a regular file")


@pytest.mark.parametrize("where", ["[experiment]\nname = 'r'\nreplicas = %d\n",
                                   "[experiment]\nname = 'r'\n[[runs]]\nname = 'a'\nreplicas = %d\n"])
def test_replicas_are_bounded(tmp_path, capsys, where):
    """replicas = 100000000 was accepted and ran for ever (10**12 ran out of memory)."""
    base = '[workload]\nkind = "synthetic"\nnum_requests = 2\nrate = 1\nprompt = {dist = "fixed", value = 8}\n' \
           'output = {dist = "fixed", value = 2}\n'
    text = where % 10_001
    text = text.replace("[[runs]]", base + "[[runs]]") if "[[runs]]" in text else text + base
    err = one_error(*run_file(tmp_path, capsys, text, command="validate"), "replicas")
    assert "10,000" in err or "<= 10000" in err, err
    assert run_file(tmp_path, capsys, text.replace("10001", "10000"), command="validate")[0] == 0


@pytest.mark.parametrize("module, cls", [("cost_models", "RooflineConfig"), ("cost_models", "ProfiledConfig"),
                                         ("power", "UtilisationConfig"), ("power", "TableConfig"),
                                         ("power", "FixedActiveConfig")])
def test_tensor_parallel_is_bounded_wherever_it_is_set(module, cls):
    """Each table that takes tensor_parallel holds it to [kv_cache]'s 1,024 (it went unbounded)."""
    import importlib

    import attrs

    from schedlab.configs import FieldError

    field = attrs.fields_dict(getattr(importlib.import_module(f"schedlab_plugins.{module}"), cls))["tensor_parallel"]
    field.validator(None, field, 1024)
    with pytest.raises(FieldError, match=r"must be <= 1024"):
        field.validator(None, field, 1025)


TARGET_RUN = BASE + """
[cost_model]
kind = "linear"
[target]
path = "bench.json"
"""


def test_a_measured_statistic_near_the_float_limit_is_an_error_of_minus_100_percent(tmp_path, capsys):
    """A mean E2E of 1e308 ms: (simulated - 1e308) x 100 overflowed to -inf before the division, and
    calibrate said the simulation had no value for it; run recorded the error as null."""
    (tmp_path / "bench.json").write_text(
        '{"completed": 20, "failed": 0, "request_throughput": 4.0, "mean_e2el_ms": 1e308}')
    code, err = run_file(tmp_path, capsys, TARGET_RUN)
    assert code == 0, err
    (run,) = json.loads((tmp_path / "out" / "summary.json").read_text())["studies"][0]["runs"]
    assert run["metrics"]["vs_target"]["errors_pct"]["e2e_ms.mean"] == pytest.approx(-100.0)


def test_target_statistics_that_are_nan_or_infinite_are_named_when_left_out(tmp_path, capsys):
    """NaN and -Infinity in a vllm bench serve file were dropped without a word; null (the tool's
    'no value') still is."""
    (tmp_path / "bench.json").write_text(
        '{"completed": 20, "failed": 0, "request_throughput": NaN, "output_throughput": 128.0, '
        '"median_ttft_ms": -Infinity, "mean_ttft_ms": 45, "mean_itl_ms": null}')
    code, err = run_file(tmp_path, capsys, TARGET_RUN)
    assert code == 0, err
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert "bench.json: left out, not a finite number: " in warning and "; the other 2 compared" in warning
    assert "request_throughput (nan)" in warning and "median_ttft_ms (-inf)" in warning
    assert "mean_itl_ms" not in warning


def test_a_vllm_log_listing_a_request_twice_is_refused(tmp_path, capsys):
    """A doubled log (the same request_id on two lines) ran as twice the requests."""
    line = '{"request_id": "bench-0", "input_toks": 5, "output_toks": 5, "queued_ts": 0, "first_token_ts": 1, ' \
           '"last_token_ts": 2}\n'
    (tmp_path / "log.jsonl").write_text(line + line.replace("bench-0", "bench-1") + line)
    code, err = run_file(tmp_path, capsys, '[experiment]\nname = "v"\n[workload]\nkind = "vllm_log"\n'
                                           'path = "log.jsonl"\n', command="validate")
    one_error(code, err, "log.jsonl: line 3: request_id 'bench-0' is already on line 1 (a log lists each request "
                         "once: is the file doubled?)")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["capacity", "--model", "llama-3-8b", "--gpu", "a100-80gb"], ["plugins", "-v"],
                                  ["run"]])
def test_a_full_standard_output_is_one_line_and_a_run_keeps_its_results(tmp_path, args):
    """Found by fuzzing: printing to a full device (``> /dev/full``) ended in a traceback, and a
    run whose table could not be printed threw its results away. Now one line, exit 2, and the
    run's folder written."""
    if args == ["run"]:
        (tmp_path / "exp.toml").write_text(BASE)
        args = ["run", str(tmp_path / "exp.toml"), "--out", str(tmp_path / "out")]
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "schedlab", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    line = one_error(done.returncode, "\n".join(x for x in done.stderr.splitlines()
                                               if "simulations in" not in x and "files written" not in x),
                     "could not write to the standard output (No space left on device)")
    if args[0] == "run":
        assert "what went to files is written" in line
        assert (tmp_path / "out" / "summary.json").is_file()
