"""The hunt's figures keep matplotlib's font and layout warnings off stderr, as the plots
report's do."""

from __future__ import annotations

import numpy as np

from schedlab.hunt.config import Goal
from schedlab.hunt.expression import parse_expression
from schedlab.hunt.plots import search_figure

PNG = b"\x89PNG\r\n\x1a\n"


def test_search_figure_with_a_label_no_font_has_leaks_no_warning(recwarn):
    goal = Goal(parse_expression("runs.a.ttft_ms.p99"), 1, None, ())
    curves = {"search\x01": np.array([1.0, np.nan, 1e300, 3.0]), "random": np.array([2.0, 1e-300, 5.0, np.nan])}
    assert search_figure(curves, goal)[:8] == PNG
    assert [str(w.message) for w in recwarn] == []


def test_the_counterexample_figure_draws_the_slowest_requests_past_its_rows():
    """Every request was a labelled row: a 1,000-request counterexample took two thirds of a hunt's
    evaluation to draw, 10,000 minutes, its labels one block."""
    from schedlab.hunt.plots import ROWS, rows_drawn

    n = 50
    requests = {"id": np.arange(n), "arrival_ms": np.zeros(n), "finish_ms": np.arange(n, dtype=float),
                "rejected": np.where(np.arange(n) == 3, 1, 0)}
    assert ROWS == 40
    assert rows_drawn(requests).tolist() == [3] + list(range(11, 50))  # the rejected one, then the 39 slowest
    few = {key: value[:ROWS] for key, value in requests.items()}
    assert rows_drawn(few).tolist() == list(range(ROWS))
