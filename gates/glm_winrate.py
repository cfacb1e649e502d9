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

Its instruction difficulty d_i is a fixed, precomputed file (``instruction_difficulty.csv``, fitted once by a joint
fit over the early-2024 leaderboard models, ``notebooks/instruction_difficulty.ipynb``): every later model's LC uses
it unchanged, so adding a model changes no other model's LC. That file and the gamed-baseline annotations
(``df_gamed.csv``) live only on the Hugging Face hub. What this module does instead, offline:

* instruction difficulty: a fixed stand-in file (``DEFAULT_DIFFICULTY``, 805 instructions), fitted once by
  ``build_instruction_difficulty`` from the annotations of 56 leaderboard models (``benchmarks/data/
  alpaca_eval_glm_inputs.csv.gz``) with their published coefficients held fixed, so d is on the scale those
  coefficients were fitted with (``instruction_difficulty_from_models``). Evaluations read it (``difficulty_of``) and
  never refit it.
* ``lc_standard_error`` is alpaca_eval's: the ``sem`` over instructions of the predictions at zero length difference
  (not a sampling SE). From the published coefficients (``predicted_lc_from_weights``, alpaca_eval's
  ``predict_winrate`` path) it reproduces the 37 published ``lc_standard_error`` within 0.045.
* the gamed-baseline regularisation and the L1 CV are replaced by Gaussian priors on phi and psi whose mean and SD
  are those of the 200 published models' coefficients (``GlmPrior.from_weights``); theta has a flat prior. The fit
  is the MAP estimate (soft-label log-likelihood + log prior, L-BFGS). On a 50-prompt gate set the length
  coefficient cannot be fitted alone; the prior keeps it where 200 AlpacaEval models put it.
  Without a difficulty the formula drops the psi term (alpaca_eval's ``length_controlled_minimal`` formula) and
  ``lc_standard_error`` is 0 by alpaca_eval's definition (every prediction is the same).

Measured figures: ``python benchmarks/alpaca_eval_lc.py``.
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

from gates.winrate_stats import as_float_1d, check_lengths, describe, per_item_lengths, preferences_to_scores

#: Column names of alpaca_eval's published weights file (its patsy terms).
LENGTH_TERM = "np.tanh(std_delta_len)"
DIFFICULTY_TERM = "instruction_difficulty"
INTERCEPT_TERM = "not_gamed_baseline.astype(float)"
WEIGHT_COLUMNS = (LENGTH_TERM, DIFFICULTY_TERM, INTERCEPT_TERM)

#: The bundled copy of alpaca_eval's published length_controlled_v1 weights (200 models, baseline gpt4_1106_preview).
DEFAULT_WEIGHTS = "demo:alpaca_eval/weights/weighted_alpaca_eval_gpt4_turbo.length_controlled_v1.baseline_gpt4_1106_preview.csv"

#: The fixed difficulty of AlpacaEval's 805 instructions (``build_instruction_difficulty``;
#: ``benchmarks/build_alpaca_eval_difficulty.py``), the stand-in for alpaca_eval's hub-only instruction_difficulty.csv.
DEFAULT_DIFFICULTY = Path(__file__).resolve().parent / "alpaca_eval_instruction_difficulty.csv"

#: SD of the Gaussian prior on an instruction's difficulty (logit units) in ``instruction_difficulty_from_models``:
#: the value ``build_instruction_difficulty`` chose for the shipped file (benchmarks/build_alpaca_eval_difficulty.py
#: prints the grid: mean |LC error| 0.197 points on 161 published models at 1.8, 0.23 at 1.4 and 2.0).
DIFFICULTY_PRIOR_SD = 1.8


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
    annotations: Mapping[str, tuple[Any, ...]],
    weights: pd.DataFrame,
    *,
    prior_sd: float = DIFFICULTY_PRIOR_SD,
    n_instructions: int | None = None,
    n_iter: int = 60,
) -> np.ndarray:
    """Per-instruction difficulty d_i from models' annotations, their published coefficients held fixed.

    For each instruction i, the MAP of d under a N(0, prior_sd^2) prior and the soft-label log-likelihood
    of every given model o that annotated i: ``logit P(o wins i) = theta_o + phi_o tanh(delta_oi / sd_o) + psi_o d``
    (coefficients from ``weights``; sd_o over o's own items, ddof 1, as alpaca_eval). Used once, offline, to build
    the fixed difficulty file that stands in for alpaca_eval's hub-only ``instruction_difficulty.csv``
    (``build_instruction_difficulty``); never per evaluation. The objective is strictly convex in d; its root is
    found by bisection on the gradient (undamped Newton steps overshoot on items every model loses or wins).

    Args:
        annotations: model name -> (preferences, len_model, len_baseline) with shape (n,) each, the same n
            instructions in the same order for every model; or -> (preferences, len_model, len_baseline, index)
            with ``index`` the instruction positions (ints in [0, n_instructions)) of a model that annotated only
            some instructions. Lengths are characters >= 0; NaN preferences are items without annotation.
            The names must be rows of ``weights``.
        weights: ``load_glm_weights()``.
        prior_sd: SD of the prior on d (> 0).
        n_instructions: number of instructions when ``index`` is given (default: the longest model's n).
        n_iter: bisection steps (60 reach float precision for |d| < 1e3).

    Returns:
        shape (n,), d_i in logit units (0, the prior mean, for an instruction no model annotated).

    Raises:
        ValueError: no model, a model without published weights, shapes that differ, an index out of range or
            repeated, a negative or non-finite length, a preference outside [1, 2], prior_sd <= 0.
    """
    if not annotations:
        raise ValueError("need at least one model's annotations")
    if not prior_sd > 0:
        raise ValueError(f"prior_sd must be > 0, got {prior_sd}")
    parsed = []
    for name, value in annotations.items():
        if name not in weights.index:
            raise ValueError(f"{name!r} has no published GLM weights (not a row of the weights file)")
        if len(value) not in (3, 4):
            raise ValueError(f"{name!r}: expected (preferences, len_model, len_baseline[, index]), "
                             f"got {len(value)} items")
        p = as_float_1d(f"{name}: preferences", value[0])
        lm = as_float_1d(f"{name}: len_model", value[1])
        lb = as_float_1d(f"{name}: len_baseline", value[2])
        if not (p.shape == lm.shape == lb.shape):
            raise ValueError(f"{name!r}: preferences {p.shape}, len_model {lm.shape}, len_baseline {lb.shape} differ")
        for nm, arr in (("len_model", lm), ("len_baseline", lb)):
            bad = ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                raise ValueError(f"{name!r}: {nm} item {int(np.flatnonzero(bad)[0])} is {arr[bad][0]!r} (need >= 0)")
        idx = None if len(value) == 3 else np.asarray(value[3])
        if idx is not None and (idx.shape != p.shape or not np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(f"{name!r}: index must be integers with the shape of preferences {p.shape}")
        p = np.where(p == 0.0, 1.5, p)  # alpaca_eval's legacy draw code
        if np.any((p < 1) | (p > 2)):
            raise ValueError(f"{name!r}: preference item {int(np.flatnonzero((p < 1) | (p > 2))[0])} is outside [1, 2]")
        w = weights.loc[name]
        offset = w[INTERCEPT_TERM] + w[LENGTH_TERM] * std_tanh_delta_len(lm, lb)
        parsed.append((name, p - 1.0, offset, float(w[DIFFICULTY_TERM]), idx))
    n = n_instructions if n_instructions is not None else max(r[1].size for r in parsed)
    rows = []
    for name, y, off, psi, idx in parsed:
        if idx is None:
            if y.size != n:
                raise ValueError(f"every model needs the same instructions; {name!r} has {y.size}, expected {n}")
            idx = np.arange(n)
        elif idx.size and (idx.min() < 0 or idx.max() >= n or np.unique(idx).size != idx.size):
            raise ValueError(f"{name!r}: index must be distinct positions in [0, {n})")
        Y, O, M = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
        Y[idx], O[idx], M[idx] = np.nan_to_num(y), off, ~np.isnan(y)
        rows.append((Y, O, psi, M))
    # The gradient g(d) = d / s^2 + sum_o psi_o (q_o(d) - y_o) is strictly increasing (g' >= 1 / s^2), and its
    # root lies in [-B, B] with B = s^2 * sum_o |psi_o| (beyond it the prior term dominates): bisect, all items at once.
    bound = prior_sd**2 * sum(abs(r[2]) for r in rows) + 1.0
    lo, hi = np.full(n, -bound), np.full(n, bound)
    for _ in range(n_iter):
        mid = (lo + hi) / 2
        g = mid / prior_sd**2
        for y, off, psi, m in rows:
            g = g + np.where(m, psi * (expit(off + psi * mid) - y), 0.0)
        lo, hi = np.where(g < 0, mid, lo), np.where(g < 0, hi, mid)
    return (lo + hi) / 2


def predicted_lc_from_weights(weights: pd.DataFrame, instruction_difficulty: Any, models: Sequence[str] | None = None,
                              *, baseline: str = "gpt4_1106_preview") -> pd.DataFrame:
    """alpaca_eval's LC and ``lc_standard_error`` of models from their published coefficients (no annotations).

    As alpaca_eval's ``predict_winrate`` and ``get_length_controlled_winrate``: the per-instruction prediction at zero
    length difference is ``p_mi = sigmoid((theta_m - theta_b) + (psi_m - psi_b) d_i)``; then
    ``length_controlled_winrate = 100 * mean_i p_mi`` and ``lc_standard_error = 100 * sem_i p_mi`` (pandas ``sem``,
    ddof 1). alpaca_eval's SE is this spread of the predictions over instructions, not a sampling SE of a refit.

    Args:
        weights: ``load_glm_weights()``; instruction_difficulty: shape (n,), d_i; models: rows to predict (default
            every row but the baseline); baseline: the weights' baseline row (all-zero coefficients in the file).

    Returns:
        DataFrame indexed by model: length_controlled_winrate, lc_standard_error (percent), n.

    Raises:
        ValueError: a model or the baseline not in ``weights``, or a non-finite difficulty.
    """
    d = as_float_1d("instruction_difficulty", instruction_difficulty)
    if not np.all(np.isfinite(d)):
        raise ValueError(f"instruction_difficulty item {int(np.flatnonzero(~np.isfinite(d))[0])} is not finite")
    names = [m for m in weights.index if m != baseline] if models is None else list(models)
    for m in [*names, baseline]:
        if m not in weights.index:
            raise ValueError(f"{m!r} has no published GLM weights (not a row of the weights file)")
    delta = weights.loc[names, [INTERCEPT_TERM, DIFFICULTY_TERM]].to_numpy(float) - weights.loc[
        baseline, [INTERCEPT_TERM, DIFFICULTY_TERM]].to_numpy(float)
    pred = expit(delta[:, :1] + delta[:, 1:] * d[None, :])
    return pd.DataFrame({"length_controlled_winrate": pred.mean(1) * 100,
                         "lc_standard_error": pred.std(1, ddof=1) / math.sqrt(d.size) * 100, "n": d.size}, index=names)


def load_instruction_difficulty(path: str | Path = DEFAULT_DIFFICULTY) -> pd.DataFrame:
    """The fixed per-instruction difficulty of AlpacaEval's 805 instructions (``build_instruction_difficulty``).

    Args:
        path: CSV with columns ``index`` (position in AlpacaEval's instruction order), ``instruction`` and
            ``instruction_difficulty`` (logit units), or ``demo:<file>``; default the shipped file
            (gates/alpaca_eval_instruction_difficulty.csv).

    Returns:
        DataFrame indexed by ``index`` (0..n-1) with columns instruction, instruction_difficulty.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a column missing, a difficulty not finite, the index not 0..n-1, an instruction listed twice.
    """
    p = str(path)
    if p.startswith("demo:"):
        from data.bundle import demo_path

        p = str(demo_path(p))
    df = pd.read_csv(p, keep_default_na=False)
    for col in ("index", "instruction", DIFFICULTY_TERM):
        if col not in df.columns:
            raise ValueError(f"{p}: no column {col!r} (expected index, instruction, {DIFFICULTY_TERM})")
    d = pd.to_numeric(df[DIFFICULTY_TERM], errors="coerce").to_numpy(float)
    if not np.all(np.isfinite(d)):
        r = int(np.flatnonzero(~np.isfinite(d))[0])
        raise ValueError(f"{p}: row {r}, column {DIFFICULTY_TERM!r}: {df[DIFFICULTY_TERM].iloc[r]!r} "
                         "is not a finite number")
    if df["index"].tolist() != list(range(len(df))):
        raise ValueError(f"{p}: column 'index' must be 0..{len(df) - 1} in order")
    dup = df["instruction"].duplicated()
    if dup.any():
        raise ValueError(f"{p}: row {int(np.flatnonzero(dup)[0])}: instruction listed twice")
    return df.assign(**{DIFFICULTY_TERM: d}).set_index("index")


def difficulty_of(instructions: Sequence[str], table: pd.DataFrame | None = None) -> np.ndarray:
    """The fixed difficulty of each instruction, matched by its exact text; shape (len(instructions),).

    Raises:
        ValueError: an instruction that is not one of the table's (names its position and its start).
    """
    table = load_instruction_difficulty() if table is None else table
    by_text = dict(zip(table["instruction"], table[DIFFICULTY_TERM]))
    out = np.empty(len(instructions))
    for i, s in enumerate(instructions):
        if s not in by_text:
            raise ValueError(f"instruction {i} ({str(s)[:60]!r}) has no fixed difficulty "
                             "(not an AlpacaEval instruction)")
        out[i] = by_text[s]
    return out


def build_instruction_difficulty(
    annotations: Mapping[str, tuple[Any, ...]],
    weights: pd.DataFrame,
    leaderboard: pd.DataFrame,
    *,
    n_instructions: int,
    prior_sds: Sequence[float] = (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0),
) -> tuple[np.ndarray, pd.DataFrame]:
    """Fit the fixed instruction difficulty once, from many models (what alpaca_eval ships as a file).

    alpaca_eval fixed its ``instruction_difficulty.csv`` once, from a joint fit over the leaderboard's models
    (``notebooks/instruction_difficulty.ipynb``), and every later model's LC uses that vector unchanged. Offline we
    fit it from the models whose annotations we have, with their published coefficients held fixed
    (``instruction_difficulty_from_models``), so d is on the scale those coefficients were fitted with. The prior SD
    is the one in ``prior_sds`` whose d best reproduces (mean |error|) the published ``length_controlled_winrate``
    of the leaderboard models that have no published ``lc_standard_error`` (``predicted_lc_from_weights``); the
    models with a published ``lc_standard_error`` are left out of that choice, so the SE check on them is held out.

    Args:
        annotations: as ``instruction_difficulty_from_models`` (the 4-tuple form with positions is allowed).
        weights: ``load_glm_weights()``; leaderboard: alpaca_eval's leaderboard CSV (index = model).
        n_instructions: number of instructions (805 for AlpacaEval).
        prior_sds: candidate prior SDs.

    Returns:
        (d, calibration): d shape (n_instructions,); calibration one row per prior SD: prior_sd, lc_mae (points),
        n_models, chosen (bool).

    Raises:
        ValueError: as ``instruction_difficulty_from_models``; no calibration model.
    """
    cal = [m for m in weights.index if m in leaderboard.index and m != "gpt4_1106_preview"
           and pd.isna(leaderboard.loc[m].get("lc_standard_error", math.nan))]
    if not cal:
        raise ValueError("no leaderboard model with published weights and without lc_standard_error to calibrate on")
    rows, fits = [], {}
    for s in prior_sds:
        d = instruction_difficulty_from_models(annotations, weights, prior_sd=s, n_instructions=n_instructions)
        pred = predicted_lc_from_weights(weights, d, cal)["length_controlled_winrate"]
        mae = float((pred - leaderboard.loc[cal, "length_controlled_winrate"].astype(float)).abs().mean())
        rows.append({"prior_sd": float(s), "lc_mae": mae, "n_models": len(cal)})
        fits[float(s)] = d
    t = pd.DataFrame(rows)
    best = float(t.loc[t["lc_mae"].idxmin(), "prior_sd"])
    t["chosen"] = t["prior_sd"] == best
    return fits[best], t


def model_prior(weights: pd.DataFrame, model: str) -> GlmPrior:
    """The GLM prior for ``model``: the published weights minus the model itself and its ``_verbose`` / ``_concise``
    variants (so a published model's own coefficients never inform its fit)."""
    return GlmPrior.from_weights(
        weights, exclude=[i for i in weights.index if i in (model, f"{model}_verbose", f"{model}_concise")],
        source="alpaca_eval published length_controlled_v1 weights",
    )


def lc_of_inputs(inputs: tuple[Any, ...], d: np.ndarray, prior: GlmPrior) -> GlmWinRate:
    """``glm_v1_win_rate`` of one model's (preferences, len_model, len_baseline[, index]) with the difficulty d of
    the instructions it annotated (``d[index]``). A length of 0 (an empty answer) counts as 1 character: the GLM's
    length feature is the difference, which this moves by 1 character, and ``check_lengths`` refuses 0."""
    p, lm, lb = (np.asarray(x, dtype=float) for x in inputs[:3])
    idx = np.arange(p.size) if len(inputs) == 3 else np.asarray(inputs[3])
    return glm_v1_win_rate(p, np.maximum(lm, 1.0), np.maximum(lb, 1.0), instruction_difficulty=d[idx], prior=prior)


def lc_moves_when_reference_changes(
    inputs: Mapping[str, tuple[Any, ...]],
    weights: pd.DataFrame,
    *,
    evaluate: Sequence[str],
    change: Sequence[str],
    n_instructions: int,
    prior_sd: float = DIFFICULTY_PRIOR_SD,
) -> pd.DataFrame:
    """How far other models' LC moves when one model joins or leaves the set the fixed difficulty is fitted on.

    d_full is fitted from every model in ``inputs``; for each k in ``change``, d_(-k) from all but k. The LC
    (``lc_of_inputs``, prior ``model_prior``) of every model j in ``evaluate`` other than k is computed with both;
    |LC_j(d_full) - LC_j(d_(-k))| is the move of j when k is added to (or removed from) the reference set. An
    evaluation with the shipped (fixed) difficulty never refits d, so adding a model to the *evaluated* set moves
    nothing; this measures how much the choice of reference models matters.

    Returns:
        DataFrame indexed by the changed model k: max_move (points), worst (the j that moved most), n_evaluated, and
        (NaN unless k is in ``evaluate``) held_out_lc / held_out_lc_standard_error: k's own LC and SE with d_(-k),
        i.e. with a difficulty its annotations did not inform.

    Raises:
        ValueError: a name in ``evaluate`` or ``change`` not in ``inputs``; as ``instruction_difficulty_from_models``.
    """
    for m in [*evaluate, *change]:
        if m not in inputs:
            raise ValueError(f"{m!r} is not among the models with inputs")
    d_full = instruction_difficulty_from_models(inputs, weights, prior_sd=prior_sd, n_instructions=n_instructions)
    priors = {j: model_prior(weights, j) for j in evaluate}
    base = {j: lc_of_inputs(inputs[j], d_full, priors[j]).length_controlled_winrate for j in evaluate}
    out = {}
    for k in change:
        d_k = instruction_difficulty_from_models({m: v for m, v in inputs.items() if m != k}, weights,
                                                 prior_sd=prior_sd, n_instructions=n_instructions)
        fits = {j: lc_of_inputs(inputs[j], d_k, priors.get(j) or model_prior(weights, j))
                for j in {*evaluate, k} if j in priors or j == k}
        moves = {j: abs(fits[j].length_controlled_winrate - base[j]) for j in evaluate if j != k}
        worst = max(moves, key=moves.get)
        own = fits[k] if k in priors else None
        out[k] = {"max_move": moves[worst], "worst": worst, "n_evaluated": len(moves),
                  "held_out_lc": own.length_controlled_winrate if own else math.nan,
                  "held_out_lc_standard_error": own.lc_standard_error if own else math.nan}
    return pd.DataFrame.from_dict(out, orient="index")


def published_lc_comparison(
    annotations: Mapping[str, Sequence[Mapping[str, Any]]],
    weights: pd.DataFrame,
    leaderboard: pd.DataFrame,
    *,
    difficulty: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """How far this module's LC and ``lc_standard_error`` land from AlpacaEval's published ones, model by model.

    For each model m: the fixed instruction difficulty (``load_instruction_difficulty``, matched by instruction
    text, never refitted here, so which other models are given changes nothing), the prior from the published
    weights minus m and its ``_verbose`` / ``_concise`` variants (``model_prior``), then ``glm_v1_win_rate`` on m's
    own annotations. The minimal GLM (no difficulty, same prior) is shown next to it.

    Args:
        annotations: model -> alpaca_eval annotation rows (``instruction``, ``preference``, ``output_1`` baseline,
            ``output_2`` model); at least 1 model.
        weights: ``load_glm_weights()``; leaderboard: alpaca_eval's leaderboard CSV (index = model).
        difficulty: ``load_instruction_difficulty()`` (the default file when None).

    Returns:
        DataFrame indexed by model: win_rate, discrete_win_rate, published_win_rate, published_discrete_win_rate,
        length_controlled_winrate, lc_standard_error, lc_minimal, published_lc, lc_error (ours - published),
        published_lc_standard_error (NaN where the leaderboard leaves it empty), lc_standard_error_error.

    Raises:
        ValueError: no model, a model missing from the leaderboard or the weights, a row without a field, an
            instruction without a fixed difficulty.
    """
    if not annotations:
        raise ValueError("need at least 1 model's annotations")
    table = load_instruction_difficulty() if difficulty is None else difficulty
    out = {}
    for m, rows in annotations.items():
        if m not in leaderboard.index:
            raise ValueError(f"{m!r} is not in the leaderboard")
        for i, r in enumerate(rows):
            for k in ("instruction", "preference", "output_1", "output_2"):
                if k not in r:
                    raise ValueError(f"{m}: row {i} has no field {k!r}")
        p = np.asarray([r["preference"] for r in rows], dtype=float)
        l_m = per_item_lengths([r["output_2"] for r in rows])
        l_b = per_item_lengths([r["output_1"] for r in rows])
        d = difficulty_of([r["instruction"] for r in rows], table)
        prior = model_prior(weights, m)
        g = lc_of_inputs((p, l_m, l_b), d, prior)
        g0 = glm_v1_win_rate(p, np.maximum(l_m, 1.0), np.maximum(l_b, 1.0), prior=prior)
        row = describe(preferences_to_scores(p))
        pub = leaderboard.loc[m]
        pub_se = float(pub["lc_standard_error"]) if "lc_standard_error" in pub.index else math.nan
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
            "published_lc_standard_error": pub_se,
            "lc_standard_error_error": g.lc_standard_error - pub_se,
        }
    return pd.DataFrame.from_dict(out, orient="index")
