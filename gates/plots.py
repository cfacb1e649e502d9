"""Report plots (PNG) for the gate report: per-intent heatmap, win rate by length bucket, drift across rounds.

Drawn with matplotlib's object API on an Agg canvas (``matplotlib.figure.Figure`` +
``backends.backend_agg.FigureCanvasAgg``): no pyplot, no global backend switch, no display needed,
safe to call from a Prefect task or a test. Each function writes one PNG (parent directories
created), returns its path, and raises ``ValueError`` on empty input rather than writing an empty
picture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gates.drift import COUNTERS, DEFAULT_MAX_STEP
from judging.intervals import wilson

DPI = 110


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{path}: plots are written as PNG; give a path ending in .png")
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=DPI, bbox_inches="tight")
    return path


def intent_heatmap(
    win_rates: pd.DataFrame | Mapping[str, Mapping[str, float]],
    path: str | Path,
    *,
    n: pd.DataFrame | Mapping[str, Mapping[str, int]] | None = None,
    bar: float = 50.0,
    title: str = "Win rate by intent (%)",
) -> Path:
    """Heatmap of win rate (percent) per intent (rows) and model (columns), centred on ``bar``.

    Args:
        win_rates: DataFrame indexed by intent with one column per model, or a mapping
            model -> {intent: win rate}; NaN = no data (drawn blank, labelled "-").
        path: output .png.
        n: optional item counts of the same shape, printed under each value.
        bar: colour midpoint (percent).

    Returns:
        The path written.

    Raises:
        ValueError: no intents or no models, or a path not ending in .png.
    """
    df = pd.DataFrame(win_rates) if not isinstance(win_rates, pd.DataFrame) else win_rates
    if df.empty or df.shape[0] == 0 or df.shape[1] == 0:
        raise ValueError("intent_heatmap needs at least one intent and one model")
    df = df.astype(float)
    counts = None if n is None else (pd.DataFrame(n) if not isinstance(n, pd.DataFrame) else n).reindex_like(df)
    fig = Figure(figsize=(1.6 + 1.3 * df.shape[1], 0.9 + 0.45 * df.shape[0]))
    ax = fig.add_subplot()
    vals = np.ma.masked_invalid(df.to_numpy())
    span = max(bar, 100 - bar)
    im = ax.imshow(vals, cmap="RdBu", vmin=bar - span, vmax=bar + span, aspect="auto")
    ax.set_xticks(range(df.shape[1]), [str(c) for c in df.columns], rotation=30, ha="right")
    ax.set_yticks(range(df.shape[0]), [str(i) for i in df.index])
    for i in range(df.shape[0]):
        for j in range(df.shape[1]):
            v = df.iat[i, j]
            txt = "-" if not math.isfinite(v) else f"{v:.1f}"
            if counts is not None and math.isfinite(v) and pd.notna(counts.iat[i, j]):
                txt += f"\nn={int(counts.iat[i, j])}"
            ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                    color="white" if math.isfinite(v) and abs(v - bar) > 0.6 * span else "black")
    fig.colorbar(im, ax=ax, label=f"win rate (%), {bar:g} = parity")
    ax.set_title(title)
    return _save(fig, path)


def bucket_bars(buckets: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """What :func:`length_bucket_plot` draws per bucket: bar height and the real interval around it.

    An empty bucket (n = 0) has no value: height NaN, no bar, no error bar (the plot writes "n = 0").
    Each error bar is the Wilson score interval of the bucket's win rate on its n pairs (draws count
    half, as in the win rate), so 6 wins of 6 is 100% with an interval of 61.0-100%, never a zero-width bar.

    Returns:
        DataFrame, one row per bucket: bucket, n, height (percent or NaN), ci_low, ci_high (percent or NaN),
        err_below, err_above (points from the height; NaN when empty), label ("<ratio range>\nn=<n>").

    Raises:
        ValueError: a win rate outside [0, 100] (beyond 1e-6 of rounding), naming the bucket.
    """
    rows = []
    for _, r in buckets.iterrows():
        n = int(r["n_total"])
        lo_t = "0" if r["ratio_low"] == 0 else f"{r['ratio_low']:.2f}"
        hi_t = "inf" if not math.isfinite(r["ratio_high"]) else f"{r['ratio_high']:.2f}"
        if n == 0 or not math.isfinite(float(r["win_rate"])):
            h = lo = hi = math.nan
        else:
            h = float(r["win_rate"])
            if not -1e-6 <= h <= 100 + 1e-6:
                raise ValueError(f"length bucket {int(r['bucket'])}: win rate {h!r} is not a percentage in [0, 100]")
            h = min(100.0, max(0.0, h))
            lo, hi = (100 * b for b in wilson(min(1.0, max(0.0, h / 100)) * n, n, confidence))
            # The Wilson interval holds its point; at 0% or 100% float rounding can put a bound a hair past it
            # (0 of 3: lower 4.9e-15), which matplotlib refuses as a negative error bar.
            lo, hi = min(lo, h), max(hi, h)
        rows.append({"bucket": int(r["bucket"]), "n": n, "height": h, "ci_low": lo, "ci_high": hi,
                     "err_below": h - lo, "err_above": hi - h, "label": f"{lo_t}-{hi_t}\nn={n}"})
    return pd.DataFrame(rows)


def length_bucket_plot(
    buckets: pd.DataFrame | Any,
    path: str | Path,
    *,
    bar: float = 50.0,
    z: float = 1.959963984540054,
    title: str = "Win rate by length-ratio bucket",
) -> Path:
    """Bar chart of the win rate per length-ratio bucket (``gates.winrate.length_bucketed_win_rate``).

    Args:
        buckets: the ``buckets`` DataFrame of a ``LengthControlledWinRate`` (columns bucket,
            ratio_low, ratio_high, win_rate, standard_error, n_total) or the object itself.
        path: output .png.
        bar: reference line (percent).
        z: the interval level as a normal quantile (1.96 = 95%); error bars are each bucket's Wilson
            interval at that level (:func:`bucket_bars`); empty buckets get "n = 0" and no bar.

    Returns:
        The path written.

    Raises:
        ValueError: no bucket rows, missing columns, or all buckets empty.
    """
    df = getattr(buckets, "buckets", buckets)
    if not isinstance(df, pd.DataFrame) or df.empty:
        raise ValueError("length_bucket_plot needs a non-empty buckets table")
    need = {"bucket", "ratio_low", "ratio_high", "win_rate", "standard_error", "n_total"}
    missing = need - set(df.columns)
    if missing:
        raise ValueError(f"buckets table lacks columns {sorted(missing)}")
    if int(df["n_total"].sum()) == 0:
        raise ValueError("every length bucket is empty")
    from scipy.stats import norm

    bars = bucket_bars(df, confidence=float(2 * norm.cdf(z) - 1))
    x = np.arange(len(bars))
    fig = Figure(figsize=(1.5 + 1.2 * len(bars), 3.8))
    ax = fig.add_subplot()
    full = bars["n"].to_numpy() > 0
    colours = ["tab:gray" if b != 0 else "tab:blue" for b in bars["bucket"][full]]
    ax.bar(x[full], bars["height"][full], yerr=np.vstack([bars["err_below"][full], bars["err_above"][full]]),
           color=colours, capsize=3)
    for xi in x[~full]:
        ax.text(xi, 2, "n = 0", ha="center", va="bottom", fontsize=8, color="tab:gray")
    ax.axhline(bar, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(x, list(bars["label"]))
    ax.set_xlabel("length ratio candidate / baseline (blue = matched length)")
    ax.set_ylabel("win rate (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    return _save(fig, path)


def drift_band(key: str, reference: float, step: float) -> tuple[float, float]:
    """The allowed band around the reference value of a drift counter, clipped to the counter's range.

    Length steps are relative (``reference * step`` tokens either side), share steps are points; a
    length or a share is never below 0 and a share never above 100, so neither is the band.
    """
    half = reference * step if key == "median_length_tokens" else step
    lo, hi = max(0.0, reference - half), reference + half
    return lo, hi if key == "median_length_tokens" else min(100.0, hi)


def drift_title(compared: list[str]) -> str:
    """The drift plot's default title: what it compares, e.g. "Personality drift: baseline (SFT) vs candidate"."""
    return "Personality drift: " + " vs ".join(str(c) for c in compared)


def drift_plot(
    table: pd.DataFrame,
    path: str | Path,
    *,
    max_step: Mapping[str, float | None] | None = None,
    title: str | None = None,
) -> Path:
    """Four panels, one per drift counter, one point per compared model (``gates.drift.drift_table``'s output).

    Args:
        table: DataFrame indexed by round with the columns ``gates.drift.COUNTERS``.
        path: output .png.
        max_step: steps to show as a shaded band around the first round's value (defaults from
            ``DEFAULT_MAX_STEP``; length relative, shares in points), clipped to the counter's range
            (:func:`drift_band`).
        title: default "Personality drift: <first row> vs <last row>", e.g. "baseline (SFT) vs candidate",
            so the plot says what it compares.

    Returns:
        The path written.

    Raises:
        ValueError: no rows or a missing counter column.
    """
    if not isinstance(table, pd.DataFrame) or table.empty:
        raise ValueError("drift_plot needs a non-empty table (one row per round)")
    missing = [c for c in COUNTERS if c not in table.columns]
    if missing:
        raise ValueError(f"drift table lacks columns {missing}")
    steps = {**DEFAULT_MAX_STEP, **(max_step or {})}
    rounds = [str(r) for r in table.index]
    x = np.arange(len(rounds))
    fig = Figure(figsize=(8, 5.5))
    axes = fig.subplots(2, 2).ravel()
    units = {"median_length_tokens": "tokens", "restating_pct": "%", "bullets_pct": "%", "hedged_pct": "%"}
    for ax, key in zip(axes, COUNTERS):
        y = table[key].astype(float).to_numpy()
        ax.plot(x, y, marker="o")
        for xi, v in zip(x, y):
            ax.annotate(f"{v:g}", (xi, v), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=8)
        step = steps.get(key)
        if step is not None and len(y):
            lo, hi = drift_band(key, float(y[0]), step)
            ax.axhspan(lo, hi, color="tab:green", alpha=0.12, label=f"allowed step from {rounds[0]}")
        ax.set_xticks(x, rounds)
        ax.set_title(f"{key} ({units[key]})", fontsize=9)
        ax.margins(y=0.2)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title or drift_title(rounds))
    fig.tight_layout()
    return _save(fig, path)


def recall_by_depth_plot(rows: list[Mapping[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Constraint recall by depth, one line per (model, position), with its Wilson interval as error bars
    (``gates.consistency.gate_table``'s rows with a depth other than "all"; a position of "all" is drawn dashed).

    Args:
        rows: dicts with model, depth, position, constraint, recall_pct, ci_low_pct, ci_high_pct; rows whose
            constraint is not "all", whose depth is "all" or whose recall is None are not drawn.
        path: output .png.

    Returns:
        The path written.

    Raises:
        ValueError: no drawable row.
    """
    keep = [r for r in rows if r.get("constraint") == "all" and r.get("depth") != "all"
            and r.get("recall_pct") is not None]
    if not keep:
        raise ValueError("recall_by_depth_plot needs at least one row with a depth and a recall")
    depths = sorted({int(r["depth"]) for r in keep})
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    lines = list(dict.fromkeys((r["model"], str(r["position"])) for r in keep))
    for i, (model, pos) in enumerate(lines):
        sel = sorted((r for r in keep if r["model"] == model and str(r["position"]) == pos), key=lambda r: r["depth"])
        x = np.array([depths.index(int(r["depth"])) for r in sel]) + (i - (len(lines) - 1) / 2) * 0.04
        y = np.array([float(r["recall_pct"]) for r in sel])
        err = np.array([[y[j] - float(r["ci_low_pct"]), float(r["ci_high_pct"]) - y[j]] for j, r in enumerate(sel)]).T
        label = f"{model}, {'all positions' if pos == 'all' else f'stated at {float(pos):g}'}"
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label,
                    linestyle="--" if pos == "all" else "-", color=f"C{i}")
    ax.set_xticks(range(len(depths)), [str(d) for d in depths])
    ax.set_xlabel("turns before the probe (depth)")
    ax.set_ylabel("constraint recall (%)")
    ax.set_ylim(-5, 105)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(title or "Constraint recall by depth and position (95% Wilson intervals)", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)
