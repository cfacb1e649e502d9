"""AlpacaEval's length-controlled win rate (``length_controlled_v1``) as closely as offline data allow.

alpaca_eval (``src/alpaca_eval/metrics/glm_winrate.py``, commit cd543a1; Dubois et al. 2024,
"Length-Controlled AlpacaEval", arXiv:2404.04475) fits, per model m against the baseline b, the GLM
(patsy formula ``np.tanh(std_delta_len) + instruction_difficulty + not_gamed_baseline.astype(float) - 1``)::

    logit P(m beats b on instruction i) = theta_m + phi_m * tanh(delta_i / sd(delta)) + psi_m * d_i

with ``delta_i = len(output_1) - len(output_2)`` in characters (baseline minus model), ``d_i`` a
per-instruction difficulty (a published file), soft labels ``preference - 1`` (each item enters twice,
y = 1 with weight p and y = 0 with weight 1 - p), an L1 penalty chosen by 5-fold ``LogisticRegressionCV``,
and a regularisation that adds the baseline's own "gamed" (verbose / concise) annotations with weight 0.1
each, which share phi and psi but have no theta. Then::

    length_controlled_winrate = 100 * mean_i sigmoid(theta_m + psi_m * d_i)      (delta set to 0)
    lc_standard_error         = 100 * sem_i  sigmoid(theta_m + psi_m * d_i)      (pandas ``sem``, ddof 1)

Two of its inputs live only on the Hugging Face hub (``instruction_difficulty.csv``, ``df_gamed.csv``).
What this module does instead, with what is offline (the published coefficients of 200 models in
``alpaca_eval/weights/``):

* the gamed-baseline regularisation and the L1 CV are replaced by Gaussian priors on phi and psi whose
  mean and SD are those of the 200 published models' coefficients (``GlmPrior.from_weights``); theta
  has a flat prior. The fit is the MAP estimate (soft-label log-likelihood + log prior, L-BFGS). On a
  50-prompt gate set the length coefficient cannot be fitted alone; the prior keeps it where 200
  AlpacaEval models put it.
* instruction difficulty, when the prompts are AlpacaEval's, is estimated per instruction from other
  models' annotations with their published coefficients held fixed (``instruction_difficulty_from_models``):
  d_i = argmax sum_o loglik(p_oi | theta_o + phi_o tanh(delta_oi / sd_o) + psi_o d) - d^2 / (2 s^2).
  Without a difficulty the formula drops the psi term (alpaca_eval's ``length_controlled_minimal``
  formula) and ``lc_standard_error`` is 0 by alpaca_eval's definition (every prediction is the same).

Measured on the three shared annotation sets (README, "AlpacaEval row"; ``benchmarks/alpaca_eval_lc.py``):
+0.19, +0.13 and -0.50 LC points from the published ``length_controlled_winrate``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from scipy.special import expit, log_expit

from gates.winrate_stats import check_lengths, describe, per_item_lengths, preferences_to_scores

#: Column names of alpaca_eval's published weights file (its patsy terms).
LENGTH_TERM = "np.tanh(std_delta_len)"
DIFFICULTY_TERM = "instruction_difficulty"
INTERCEPT_TERM = "not_gamed_baseline.astype(float)"
WEIGHT_COLUMNS = (LENGTH_TERM, DIFFICULTY_TERM, INTERCEPT_TERM)

#: The bundled copy of alpaca_eval's published length_controlled_v1 weights (200 models, baseline gpt4_1106_preview).
DEFAULT_WEIGHTS = "demo:alpaca_eval/weights/weighted_alpaca_eval_gpt4_turbo.length_controlled_v1.baseline_gpt4_1106_preview.csv"

#: SD of the Gaussian prior on an instruction's difficulty (logit units) in ``instruction_difficulty_from_models``.
#: Chosen by us; LC on the three shared models moves by < 0.9 points for s in [2, 5] (README).
DIFFICULTY_PRIOR_SD = 3.0


def load_glm_weights(path: str | Path = DEFAULT_WEIGHTS) -> pd.DataFrame:
    """alpaca_eval's published GLM coefficients, one row per model.

    Args:
        path: the weights CSV (index = model name; columns ``WEIGHT_COLUMNS``), or ``demo:<file>``.

    Returns:
        DataFrame indexed by model with the three coefficient columns (float); a model listed twice keeps its
        last row, as alpaca_eval's writer does.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a coefficient column is missing, or a coefficient is not a finite number (names file, row, column).
    """
    p = str(path)
    if p.startswith("demo:"):
        from data.bundle import demo_path

        p = str(demo_path(p))
    df = pd.read_csv(p, index_col=0)
    for col in WEIGHT_COLUMNS:
        if col not in df.columns:
            raise ValueError(f"{p}: no column {col!r} (expected alpaca_eval's weights file with {WEIGHT_COLUMNS})")
    df = df[list(WEIGHT_COLUMNS)].apply(pd.to_numeric, errors="coerce")
    bad = ~np.isfinite(df.to_numpy(dtype=float))
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise ValueError(f"{p}: row {r} ({df.index[r]!r}), column {WEIGHT_COLUMNS[c]!r}: not a finite number")
    return df[~df.index.duplicated(keep="last")]


@dataclass(frozen=True)
class GlmPrior:
    """Gaussian priors on the length coefficient phi and the difficulty coefficient psi (logit units).

    Fields: length_mean, length_sd, difficulty_mean, difficulty_sd, n_models (how many published models
    they summarise), source (file or description).
    """

    length_mean: float
    length_sd: float
    difficulty_mean: float
    difficulty_sd: float
    n_models: int
    source: str = ""

    @classmethod
    def from_weights(cls, weights: pd.DataFrame, *, exclude: Sequence[str] = (), source: str = "") -> "GlmPrior":
        """Mean and SD (ddof 1) of the published phi and psi over the models in ``weights`` minus ``exclude``
        and minus the baseline itself (its all-zero row).

        Raises:
            ValueError: fewer than 2 models left.
        """
        w = weights.drop(index=[m for m in exclude if m in weights.index])
        w = w[(w[list(WEIGHT_COLUMNS)] != 0).any(axis=1)]
        if len(w) < 2:
            raise ValueError(f"a prior needs at least 2 published models, got {len(w)}")
        return cls(
            length_mean=float(w[LENGTH_TERM].mean()),
            length_sd=float(w[LENGTH_TERM].std()),
            difficulty_mean=float(w[DIFFICULTY_TERM].mean()),
            difficulty_sd=float(w[DIFFICULTY_TERM].std()),
            n_models=int(len(w)),
            source=source,
        )


@dataclass(frozen=True)
class GlmWinRate:
    """Result of ``glm_v1_win_rate`` (percent unless noted).

    Fields:
        length_controlled_winrate, lc_standard_error: as alpaca_eval defines them (module docstring).
        win_rate: the raw (weighted) win rate of the same items.
        theta, phi, psi: fitted coefficients (psi NaN without difficulty).
        n: items used.
        uses_difficulty: whether the psi term was in the model.
        prior: the ``GlmPrior`` used (None = unpenalised maximum likelihood).
        predicted: shape (n,), per-item P(candidate wins) at zero length difference (fraction).
    """

    length_controlled_winrate: float
    lc_standard_error: float
    win_rate: float
    theta: float
    phi: float
    psi: float
    n: int
    uses_difficulty: bool
    prior: GlmPrior | None
    predicted: np.ndarray

    @property
    def points_explained_by_length(self) -> float:
        """``win_rate - length_controlled_winrate`` (points)."""
        return self.win_rate - self.length_controlled_winrate


def std_tanh_delta_len(len_candidate: Any, len_baseline: Any) -> np.ndarray:
    """alpaca_eval's length feature ``tanh((len_baseline - len_candidate) / sd)``, sd with ddof 1; shape (n,).

    Zeros when every difference is equal (sd 0).
    """
    delta = np.asarray(len_baseline, dtype=float) - np.asarray(len_candidate, dtype=float)
    sd = delta.std(ddof=1) if delta.size > 1 else 0.0
    return np.tanh(delta / sd) if sd > 0 else np.zeros_like(delta)


def _fit_soft_logit(X: np.ndarray, y: np.ndarray, mean: np.ndarray, prec: np.ndarray) -> np.ndarray:
    """MAP of a logistic model with soft labels y in [0, 1] and independent Gaussian priors (precision 0 = flat)."""

    def f(b):
        z = X @ b
        nll = -(y * log_expit(z) + (1 - y) * log_expit(-z)).sum() + 0.5 * (prec * (b - mean) ** 2).sum()
        grad = X.T @ (expit(z) - y) + prec * (b - mean)
        return nll, grad

    res = minimize(f, np.where(prec > 0, mean, 0.0), jac=True, method="L-BFGS-B", options={"maxiter": 2000, "gtol": 1e-9})
    if not res.success and not np.all(np.isfinite(res.x)):
        raise RuntimeError(f"GLM fit failed: {res.message}")
    return res.x


def glm_v1_win_rate(
    preferences: Any,
    len_candidate: Any,
    len_baseline: Any,
    *,
    instruction_difficulty: Any = None,
    prior: GlmPrior | None = None,
) -> GlmWinRate:
    """Length-controlled win rate after alpaca_eval's ``length_controlled_v1`` (module docstring).

    Args:
        preferences: shape (n,), AlpacaEval preferences in [1, 2] (0 = legacy draw; NaN items dropped).
        len_candidate, len_baseline: shape (n,), lengths > 0 (alpaca_eval: characters of output_2 / output_1).
        instruction_difficulty: optional shape (n,), d_i (logit units); None drops the psi term.
        prior: Gaussian priors on phi (and psi); None fits by unpenalised maximum likelihood (alpaca_eval
            without its regularisation; unstable on small sets).

    Returns:
        ``GlmWinRate``.

    Raises:
        ValueError: invalid preferences or lengths (see ``gates.winrate_stats``), difficulty of another length or
            not finite, fewer than 2 items.
    """
    p, lc, lb = check_lengths(preferences, len_candidate, len_baseline)
    keep = ~np.isnan(p)
    y = preferences_to_scores(p)
    if y.size < 2:
        raise ValueError("the GLM needs at least 2 annotated items")
    x = std_tanh_delta_len(lc[keep], lb[keep])
    cols = [np.ones_like(x), x]
    mean, prec = [0.0, 0.0], [0.0, 0.0]
    if prior is not None:
        mean[1], prec[1] = prior.length_mean, 1.0 / prior.length_sd**2
    d = None
    if instruction_difficulty is not None:
        d = np.asarray(instruction_difficulty, dtype=float)
        if d.shape != p.shape:
            raise ValueError(f"instruction_difficulty {d.shape} must have the shape of preferences {p.shape}")
        if not np.all(np.isfinite(d)):
            raise ValueError(f"instruction_difficulty item {int(np.flatnonzero(~np.isfinite(d))[0])} is not finite")
        d = d[keep]
        cols.append(d)
        mean.append(prior.difficulty_mean if prior else 0.0)
        prec.append(1.0 / prior.difficulty_sd**2 if prior else 0.0)
    b = _fit_soft_logit(np.column_stack(cols), y, np.array(mean), np.array(prec))
    z0 = b[0] + (b[2] * d if d is not None else 0.0)
    pred = np.broadcast_to(expit(z0), y.shape).astype(float)
    return GlmWinRate(
        length_controlled_winrate=float(pred.mean() * 100),
        lc_standard_error=float(pd.Series(pred).sem() * 100),
        win_rate=float(y.mean() * 100),
        theta=float(b[0]),
        phi=float(b[1]),
        psi=float(b[2]) if d is not None else math.nan,
        n=int(y.size),
        uses_difficulty=d is not None,
        prior=prior,
        predicted=pred,
    )


def instruction_difficulty_from_models(
    annotations: Mapping[str, tuple[Any, Any, Any]],
    weights: pd.DataFrame,
    *,
    prior_sd: float = DIFFICULTY_PRIOR_SD,
    n_iter: int = 60,
) -> np.ndarray:
    """Per-instruction difficulty d_i from other models' annotations, their published coefficients held fixed.

    For each instruction i, the MAP of d under a N(0, prior_sd^2) prior and the soft-label log-likelihood
    of every given model o: ``logit P(o wins i) = theta_o + phi_o tanh(delta_oi / sd_o) + psi_o d``
    (coefficients from ``weights``). A stand-in for alpaca_eval's hub-only ``instruction_difficulty.csv``,
    which was fitted jointly over many models. The objective is strictly convex in d; its root is found by
    bisection on the gradient (undamped Newton steps overshoot on items every model loses or wins).

    Args:
        annotations: model name -> (preferences, len_model, len_baseline), each shape (n,), the same n
            instructions in the same order for every model; the names must be rows of ``weights``.
        weights: ``load_glm_weights()``.
        prior_sd: SD of the prior on d (> 0).
        n_iter: bisection steps (60 reach float precision for |d| < 1e3).

    Returns:
        shape (n,), d_i in logit units.

    Raises:
        ValueError: no model, a model without published weights, shapes that differ, NaN preferences, prior_sd <= 0.
    """
    if not annotations:
        raise ValueError("need at least one model's annotations")
    if not prior_sd > 0:
        raise ValueError(f"prior_sd must be > 0, got {prior_sd}")
    rows = []
    for name, (prefs, l_m, l_b) in annotations.items():
        if name not in weights.index:
            raise ValueError(f"{name!r} has no published GLM weights (not a row of the weights file)")
        p, lm, lbase = check_lengths(prefs, l_m, l_b)
        if np.isnan(p).any():
            raise ValueError(f"{name!r}: preference item {int(np.flatnonzero(np.isnan(p))[0])} is NaN")
        w = weights.loc[name]
        offset = w[INTERCEPT_TERM] + w[LENGTH_TERM] * std_tanh_delta_len(lm, lbase)
        rows.append((preferences_to_scores(p), offset, float(w[DIFFICULTY_TERM])))
    n = rows[0][0].size
    if any(r[0].size != n for r in rows):
        raise ValueError(f"every model needs the same instructions; sizes {[r[0].size for r in rows]}")
    # The gradient g(d) = d / s^2 + sum_o psi_o (q_o(d) - y_o) is strictly increasing (g' >= 1 / s^2), and its
    # root lies in [-B, B] with B = s^2 * sum_o |psi_o| (beyond it the prior term dominates): bisect, all items at once.
    bound = prior_sd**2 * sum(abs(r[2]) for r in rows) + 1.0
    lo, hi = np.full(n, -bound), np.full(n, bound)
    for _ in range(n_iter):
        mid = (lo + hi) / 2
        g = mid / prior_sd**2
        for y, off, psi in rows:
            g = g + psi * (expit(off + psi * mid) - y)
        lo, hi = np.where(g < 0, mid, lo), np.where(g < 0, hi, mid)
    d = (lo + hi) / 2
    return d


def published_lc_comparison(
    annotations: Mapping[str, Sequence[Mapping[str, Any]]],
    weights: pd.DataFrame,
    leaderboard: pd.DataFrame,
    *,
    prior_sd: float = DIFFICULTY_PRIOR_SD,
) -> pd.DataFrame:
    """How far this module's LC lands from AlpacaEval's published LC, model by model (leave-one-model-out).

    For each model m: instruction difficulty from the OTHER given models (``instruction_difficulty_from_models``,
    their published coefficients), the prior from the published weights minus m and its ``_verbose`` /
    ``_concise`` variants, then ``glm_v1_win_rate`` on m's own annotations. The minimal GLM (no difficulty,
    same prior) is shown next to it.

    Args:
        annotations: model -> alpaca_eval annotation rows (``preference``, ``output_1`` baseline, ``output_2``
            model), the same instructions in the same order for every model; at least 2 models.
        weights: ``load_glm_weights()``; leaderboard: alpaca_eval's leaderboard CSV (index = model).
        prior_sd: see ``instruction_difficulty_from_models``.

    Returns:
        DataFrame indexed by model: win_rate, discrete_win_rate, published_win_rate, published_discrete_win_rate,
        length_controlled_winrate, lc_standard_error, lc_minimal, published_lc, lc_error (ours - published).

    Raises:
        ValueError: fewer than 2 models, a model missing from the leaderboard or the weights, or bad rows.
    """
    if len(annotations) < 2:
        raise ValueError("need at least 2 models: difficulty is estimated from the others")
    tri = {}
    for m, rows in annotations.items():
        if m not in leaderboard.index:
            raise ValueError(f"{m!r} is not in the leaderboard")
        for i, r in enumerate(rows):
            for k in ("preference", "output_1", "output_2"):
                if k not in r:
                    raise ValueError(f"{m}: row {i} has no field {k!r}")
        tri[m] = (
            np.asarray([r["preference"] for r in rows], dtype=float),
            per_item_lengths([r["output_2"] for r in rows]),
            per_item_lengths([r["output_1"] for r in rows]),
        )
    out = {}
    for m, (p, l_m, l_b) in tri.items():
        d = instruction_difficulty_from_models({o: v for o, v in tri.items() if o != m}, weights, prior_sd=prior_sd)
        prior = GlmPrior.from_weights(
            weights, exclude=[i for i in weights.index if i in (m, f"{m}_verbose", f"{m}_concise")],
            source="alpaca_eval published length_controlled_v1 weights",
        )
        g = glm_v1_win_rate(p, l_m, l_b, instruction_difficulty=d, prior=prior)
        g0 = glm_v1_win_rate(p, l_m, l_b, prior=prior)
        row = describe(preferences_to_scores(p))
        pub = leaderboard.loc[m]
        out[m] = {
            "win_rate": float(row["win_rate"]),
            "discrete_win_rate": float(row["discrete_win_rate"]),
            "published_win_rate": float(pub["win_rate"]),
            "published_discrete_win_rate": float(pub["discrete_win_rate"]),
            "length_controlled_winrate": g.length_controlled_winrate,
            "lc_standard_error": g.lc_standard_error,
            "lc_minimal": g0.length_controlled_winrate,
            "published_lc": float(pub["length_controlled_winrate"]),
            "lc_error": g.length_controlled_winrate - float(pub["length_controlled_winrate"]),
        }
    return pd.DataFrame.from_dict(out, orient="index")
