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
