"""The figures of the what-if report, as plotly ``graph_objects`` built from DataFrames.

Each builder is a pure function of a summary DataFrame (one row per run x
policy, see ``dsim.analysis.summary``) or of per-iteration replay DataFrames: no I/O,
so the page assembly (``dsim.render.html``) and the tests can use them alike.
One module per figure (``attribution`` holds the two of whose loader is late);
what they share lives in ``style`` (look), ``labels``
(names and order of policies and runs) and ``downsample`` (thinning long
traces so the page stays responsive).
"""

from __future__ import annotations

from dsim.render.figures.attribution import last_figure, workers_figure
from dsim.render.figures.bars import bars_figure
from dsim.render.figures.cdf import TAIL_QUANTILE, cdf_figure
from dsim.render.figures.downsample import MAX_POINTS, downsample_minmax, ecdf_points
from dsim.render.figures.heatmap import heatmap_figure
from dsim.render.figures.labels import (
    ordered_policies,
    policy_name,
    policy_of,
    short_labels,
    variant_text,
    wrap_name,
)
from dsim.render.figures.scaling import scaling_figure
from dsim.render.figures.spread import SPREAD_QUANTILES, quantile_spread, whiskers
from dsim.render.figures.style import FONT, GPU_COLORS, POLICY_COLORS, gpu_color, policy_color
from dsim.render.figures.timeline import HOVER_AT, timeline_figure
from dsim.render.figures.tune import tune_figure

__all__ = [
    "FONT",
    "GPU_COLORS",
    "HOVER_AT",
    "MAX_POINTS",
    "POLICY_COLORS",
    "SPREAD_QUANTILES",
    "TAIL_QUANTILE",
    "bars_figure",
    "cdf_figure",
    "downsample_minmax",
    "ecdf_points",
    "gpu_color",
    "heatmap_figure",
    "last_figure",
    "ordered_policies",
    "policy_color",
    "policy_name",
    "policy_of",
    "quantile_spread",
    "scaling_figure",
    "short_labels",
    "timeline_figure",
    "tune_figure",
    "variant_text",
    "whiskers",
    "workers_figure",
    "wrap_name",
]
