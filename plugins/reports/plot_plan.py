"""A capacity plan's cost against SLO attainment: every deployment simulated, the frontier.

One point per deployment the plan simulated (x: cost per hour, y: the plan's attainment
metric), coloured by GPU, filled when it meets the plan's constraints and hollow when it does
not. The Pareto frontier -- deployments no other one beats on both cost and attainment -- is
a step line; the cheapest deployment meeting the constraints is a star; a dashed line marks
the attainment the constraints ask for. Gids: ``deployment:<run>``, ``frontier``,
``cheapest``, ``target``.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from schedlab.study.planner import deployment_text

from .plot_common import COLORS, metric_label, new_figure, note, titles


def plan_figure(study, dpi: int) -> Figure | None:
    plan = study.plan
    points = [d for d in plan.deployments if math.isfinite(_number(d["attainment"]))]
    if not plan.deployments:
        return None
    fig = new_figure(8.0, 5.2, dpi)
    ax = fig.subplots()
    gpus = list(dict.fromkeys(d["gpu"] for d in plan.deployments))
    for d in points:
        color = COLORS[gpus.index(d["gpu"]) % len(COLORS)]
        (dot,) = ax.plot([d["cost"]], [d["attainment"]], marker="o", markersize=6, linestyle="none",
                         color=color, markerfacecolor=color if d["meets"] else "none", alpha=0.85)
        dot.set_gid(f"deployment:{d['run']}")
    by_run = {d["run"]: d for d in points}
    frontier = [by_run[name] for name in plan.frontier if name in by_run]
    if frontier:
        (line,) = ax.plot([d["cost"] for d in frontier], [d["attainment"] for d in frontier], drawstyle="steps-post",
                          color="0.25", linewidth=1.4)
        line.set_gid("frontier")
    if plan.cheapest is not None and plan.cheapest["run"] in by_run:
        best = by_run[plan.cheapest["run"]]
        (star,) = ax.plot([best["cost"]], [best["attainment"]], marker="*", markersize=16, linestyle="none",
                          color=COLORS[3], markeredgecolor="0.1")
        star.set_gid("cheapest")
        ax.annotate(f"{deployment_text(plan.cheapest)}: ${best['cost']:,.2f}/h", (best["cost"], best["attainment"]),
                    xytext=(8, -14), textcoords="offset points", fontsize=9)
    if plan.target is not None:
        target = ax.axhline(plan.target, linestyle="--", linewidth=1.2, color=COLORS[3])
        target.set_gid("target")
    if not points:
        note(ax, f"no {plan.attainment} values (NaN)" + (": the runs have no [slo] targets"
                                                          if plan.attainment.startswith("slo.") else ""))
    ax.set_xlabel("cost ($ per hour)")
    ax.set_ylabel(metric_label(plan.attainment))
    ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], marker="o", linestyle="none", color=COLORS[i % len(COLORS)], label=gpu)
               for i, gpu in enumerate(gpus)]
    handles += [Line2D([], [], marker="o", linestyle="none", color="0.4", markerfacecolor="none",
                       label="misses the constraints"),
                Line2D([], [], color="0.25", drawstyle="steps-post", label="Pareto frontier")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), frameon=False)
    if plan.cheapest is not None:
        c = plan.cheapest
        subtitle = f"cheapest with {plan.constraint}: {deployment_text(c)} at ${c['cost']:,.2f}/h"
    else:
        subtitle = f"nothing meets {plan.constraint}"
    subtitle += f"\n{len(plan.deployments)} of {plan.grid_size} deployments simulated"
    titles(fig, f"capacity plan {study.name}: cost vs {plan.attainment}", subtitle)
    return fig


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
