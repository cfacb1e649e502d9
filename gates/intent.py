"""Per-intent matrix: win rate per intent cluster, weighted by the round's traffic-share table.

DESIGN.md principle 7: the eval mix follows traffic. Per-intent win rates are combined with a
traffic-share table that is an *input of the round* (a file: :func:`traffic_shares`), never with
the number of prompts the team happened to write per intent. The prompt-count average is shown
only to show why it is not used (principle 1).

Intents come from the data's own categories (AlpacaEval ``dataset``, MT-bench ``category``,
PandaLM ``motivation_app``). Nothing is dropped silently: intents in the data but absent from
the traffic table, and traffic intents without data, are listed in the table and the reason.

Preferences follow AlpacaEval's convention (``gates.winrate``): 2 = candidate wins, 1 = baseline
wins, 1.5 = draw, values in between are weighted preferences; NaN = no annotation (dropped and
counted).

Intervals (percent):
  * per intent: exact Clopper-Pearson (statsmodels) when every preference is 1 or 2 (binary
    outcomes), else a percentile bootstrap of the mean score (``n_boot`` resamples, ``seed``);
  * traffic-weighted overall: stratified percentile bootstrap (each intent resampled within
    itself, the weighted mean recomputed), same ``n_boot`` / ``seed``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml

from gates import wording
from gates.result import Finding, GateResult, Metric, Verdict
from gates.winrate import preferences_to_scores
from gates.winrate_corrected import HARD_MIN_AGREEMENT, JUDGE_DECISIONS
from judging.intervals import bootstrap_means, exact, percentile

GATE_NAME = "intent_matrix"
GATE_VERSION = "1"
SHARE_TOLERANCE = 1e-6
DEFAULT_MIN_SHARE = 0.05
DEFAULT_BAR = 50.0
DEFAULT_MIN_ITEMS = 10
DEFAULT_CONFIDENCE = 0.95
DEFAULT_N_BOOT = 2000
UNLABELLED = "(unlabelled)"

# --------------------------------------------------------------------------------------------
# traffic-share table
# --------------------------------------------------------------------------------------------


def _check_shares(shares: Mapping[str, Any], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    if not shares:
        raise ValueError(f"{label}: the traffic-share table is empty")
    for intent, share in shares.items():
        if not isinstance(intent, str) or not intent.strip():
            raise ValueError(f"{label}: intent names must be non-empty strings, got {intent!r}")
        if isinstance(share, bool):  # a file value, reported like any other bad value
            raise ValueError(f"{label}: share of {intent!r} must be a number, got {share!r}")  # noqa: TRY004
        try:
            v = float(share)
        except (TypeError, ValueError):
            raise ValueError(f"{label}: share of {intent!r} must be a number, got {share!r}") from None
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ValueError(f"{label}: share of {intent!r} must be a fraction in [0, 1], got {share!r}")
        out[intent.strip()] = v
    total = math.fsum(out.values())
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise ValueError(
            f"{label}: traffic shares must sum to 1 (within {SHARE_TOLERANCE:g}), but they sum to {total:.9g}"
        )
    return out


def traffic_shares(path: str | Path) -> dict[str, float]:
    """Read a traffic-share table: intent -> share of production traffic (fraction).

    Formats (chosen by extension):
      * ``.csv``: a header with columns ``intent`` and ``share`` (other columns ignored);
      * ``.yaml`` / ``.yml``: a mapping ``{intent: share}``, or ``{"shares": {...}}``, or a list of
        ``{intent: ..., share: ...}`` records.

    Shares are fractions in [0, 1] and must sum to 1 within 1e-6.

    Args:
        path: the file.

    Returns:
        dict intent -> share, in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unknown extension, missing column, duplicate intent, a share that is not a
            fraction in [0, 1], or shares that do not sum to 1 (the message names the file and
            the sum).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"traffic-share table {p} does not exist")
    text = p.read_text(encoding="utf-8")
    suffix = p.suffix.lower()
    pairs: list[tuple[Any, Any]]
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        cols = [c.strip() for c in (reader.fieldnames or [])]
        for col in ("intent", "share"):
            if col not in cols:
                raise ValueError(f"{p}: missing column {col!r} (columns: {cols})")
        pairs = []
        for rec in reader:
            rec = {(k or "").strip(): v for k, v in rec.items()}
            if not any((v or "").strip() for v in rec.values() if isinstance(v, str)):
                continue  # blank line
            pairs.append((rec.get("intent"), (rec.get("share") or "").strip()))
    elif suffix in (".yaml", ".yml"):
        data = yaml.safe_load(text)
        if isinstance(data, Mapping) and set(data) == {"shares"}:
            data = data["shares"]
        if isinstance(data, Mapping):
            pairs = list(data.items())
        elif isinstance(data, list) and all(isinstance(r, Mapping) for r in data):
            for i, r in enumerate(data):
                if "intent" not in r or "share" not in r:
                    raise ValueError(f"{p}: record {i} needs keys 'intent' and 'share', got {sorted(r)}")
            pairs = [(r["intent"], r["share"]) for r in data]
        else:
            raise ValueError(f"{p}: expected a mapping intent -> share or a list of {{intent, share}} records")
    else:
        raise ValueError(f"{p}: unknown traffic-share format {suffix!r}; use .csv, .yaml or .yml")
    seen: dict[str, Any] = {}
    for intent, share in pairs:
        key = intent.strip() if isinstance(intent, str) else intent
        if key in seen:
            raise ValueError(f"{p}: intent {key!r} appears more than once")
        seen[key] = share
    return _check_shares(seen, str(p))


# --------------------------------------------------------------------------------------------
# per-intent statistics
# --------------------------------------------------------------------------------------------


def _intent_labels(intents: Sequence[Any], n: int) -> list[str]:
    labels = list(intents)
    if len(labels) != n:
        raise ValueError(f"preferences ({n}) and intents ({len(labels)}) differ in length")
    out = []
    for x in labels:
        if x is None or (isinstance(x, float) and math.isnan(x)) or (isinstance(x, str) and not x.strip()):
            out.append(UNLABELLED)
        else:
            out.append(str(x).strip())
    return out


def intent_win_rates(
    preferences: Any,
    intents: Sequence[Any],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    ci_method: Literal["auto", "exact", "bootstrap"] = "auto",
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
) -> pd.DataFrame:
    """Win rate per intent with interval and n (AlpacaEval's ``win_rate`` within each intent).

    Args:
        preferences: shape (n_items,), AlpacaEval preferences (NaN = no annotation, dropped).
        intents: shape (n_items,), intent labels; None / NaN / "" become ``"(unlabelled)"``.
        confidence: interval level.
        ci_method: "exact" (Clopper-Pearson on wins / n; needs preferences in {1, 2}),
            "bootstrap" (percentile bootstrap of the mean score), "auto" (exact when possible).
        n_boot, seed: bootstrap resamples and seed (the result is deterministic).

    Returns:
        DataFrame indexed by intent (sorted), columns: n, win_rate, ci_low, ci_high (percent),
        n_wins, n_wins_base, n_draws, n_unannotated, ci_method.

    Raises:
        ValueError: invalid preferences (see ``gates.winrate.preferences_to_scores``), lengths
            differ, ``ci_method="exact"`` with non-binary preferences, or bad confidence / n_boot.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100, got {n_boot}")
    if ci_method not in ("auto", "exact", "bootstrap"):
        raise ValueError(f"ci_method must be 'auto', 'exact' or 'bootstrap', got {ci_method!r}")
    p = np.asarray(preferences, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"preferences must be 1-D, got shape {p.shape}")
    labels = np.asarray(_intent_labels(intents, p.size), dtype=object)
    preferences_to_scores(p)  # validate the whole vector once (range, convention)
    rng = np.random.default_rng(seed)
    rows = []
    for intent in sorted(set(labels.tolist())):
        sel = labels == intent
        n_nan = int(np.isnan(p[sel]).sum())
        s = preferences_to_scores(p[sel]) if (~np.isnan(p[sel])).any() else np.zeros(0)
        n = int(s.size)
        binary = bool(np.isin(s, (0.0, 1.0)).all())
        method = ("exact" if binary else "bootstrap") if ci_method == "auto" else ci_method
        if method == "exact" and not binary:
            raise ValueError(f"intent {intent!r}: ci_method='exact' needs preferences in {{1, 2}} (no draws or weights)")
        if n == 0:
            wr, lo, hi = math.nan, math.nan, math.nan
        elif method == "exact":
            k = int(s.sum())
            wr = 100 * k / n
            lo, hi = (100 * v for v in exact(k, n, confidence))
        else:
            wr = 100 * float(s.mean())
            if n < 2:
                lo, hi = math.nan, math.nan
            else:
                lo, hi = (100 * v for v in percentile(bootstrap_means(s, n_boot, rng), confidence))
        rows.append({
            "intent": intent, "n": n, "win_rate": wr, "ci_low": lo, "ci_high": hi,
            "n_wins": int((s > 0.5).sum()), "n_wins_base": int((s < 0.5).sum()), "n_draws": int((s == 0.5).sum()),
            "n_unannotated": n_nan, "ci_method": method,
        })
    return pd.DataFrame(rows).set_index("intent")


def traffic_weighted_win_rate(
    preferences: Any,
    intents: Sequence[Any],
    traffic: Mapping[str, float],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
) -> tuple[float, float, float, float]:
    """Traffic-weighted win rate over the intents that have both a share and data.

    ``WR = sum_i s_i WR_i / sum_i s_i`` over intents i with share s_i > 0 and n_i > 0 (shares
    renormalised over what the data covers; the covered share is returned so a report can say
    how much traffic the number speaks for). Interval: stratified percentile bootstrap.

    Returns:
        (win_rate, ci_low, ci_high) in percent and the covered share (fraction); NaNs and 0.0 when
        no traffic intent has data.
    """
    p = np.asarray(preferences, dtype=float)
    labels = np.asarray(_intent_labels(intents, p.size), dtype=object)
    rng = np.random.default_rng(seed)
    parts = []
    for intent, share in traffic.items():
        if share <= 0:
            continue
        sel = (labels == intent) & ~np.isnan(p)
        if sel.any():
            parts.append((share, preferences_to_scores(p[sel])))
    covered = math.fsum(w for w, _ in parts)
    if not parts:
        return math.nan, math.nan, math.nan, 0.0
    wr = 100 * sum(w * s.mean() for w, s in parts) / covered
    boot = sum(w * bootstrap_means(s, n_boot, rng) for w, s in parts) / covered
    lo, hi = (100 * v for v in percentile(boot, confidence))
    return float(wr), lo, hi, covered


# --------------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------------


def intent_evidence(preferences: Any, intents: Sequence[Any], answered: Sequence[bool] | None = None) -> dict[str, int]:
    """Per intent, the decisive items (preference != 1.5, not NaN) whose two answers are both non-empty.

    This is the evidence an intent's win rate rests on: draws say nothing about which model is
    better, and neither does a comparison with an empty answer on a side.

    Args:
        preferences: shape (n_items,), AlpacaEval preferences.
        intents: shape (n_items,), intent labels.
        answered: shape (n_items,), True where both answers are non-empty (None: all answered).

    Returns:
        intent -> count (intents with no decisive answered item map to 0).

    Raises:
        ValueError: lengths differ or preferences invalid.
    """
    preferences_to_scores(preferences)  # validates the convention
    p = np.asarray(preferences, dtype=float)
    p = np.where(p == 0.0, 1.5, p)
    labels = _intent_labels(intents, p.size)
    ok = np.ones(p.shape, dtype=bool) if answered is None else np.asarray(answered, dtype=bool)
    if ok.shape != p.shape:
        raise ValueError(f"answered has shape {ok.shape}, preferences {p.shape}: one flag per item")
    out: dict[str, int] = {}
    for lab, pi, oi in zip(labels, p, ok):
        out[lab] = out.get(lab, 0) + int(bool(oi) and not math.isnan(pi) and pi != 1.5)
    return out


@dataclass(frozen=True)
class IntentThresholds:
    """The per-intent rule's thresholds.

    Fields:
        min_share: traffic share (fraction) from which an intent is meaningful (default 0.05).
        bar: percent, the win rate an intent must not be below on evidence (default 50).
        min_items: items (and decisive answered items) a meaningful intent needs before its interval is trusted.

    Raises:
        ValueError: min_share outside [0, 1], bar outside [0, 100], min_items < 1.
    """

    min_share: float = DEFAULT_MIN_SHARE
    bar: float = DEFAULT_BAR
    min_items: int = DEFAULT_MIN_ITEMS

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_share <= 1.0:
            raise ValueError(f"min_share must be a fraction in [0, 1], got {self.min_share}")
        if not 0.0 <= self.bar <= 100.0:
            raise ValueError(f"bar must be in percent [0, 100], got {self.bar}")
        if self.min_items < 1:
            raise ValueError(f"min_items must be >= 1, got {self.min_items}")

    def meaningful(self, share: float) -> bool:
        """Whether an intent with this traffic share can block (share >= min_share and > 0)."""
        return bool(share >= self.min_share and share > 0)


@dataclass(frozen=True)
class IntentMetrics:
    """The per-intent matrix's numbers (:func:`metrics`), before any rule.

    Fields:
        rows: one dict per intent (traffic intents in table order, then intents only in the data): intent,
            traffic_share, in_traffic_table, n, win_rate, ci_low, ci_high (percent), n_wins, n_wins_base, n_draws,
            n_unannotated, ci_method, n_decisive.
        win_rate, ci_low, ci_high, covered: :func:`traffic_weighted_win_rate`'s.
        by_count: the prompt-count average (percent; shown only to show why it is not used), over n_total items.
        confidence: interval level.
    """

    rows: tuple[dict[str, Any], ...]
    win_rate: float
    ci_low: float
    ci_high: float
    covered: float
    by_count: float
    n_total: int
    confidence: float


def _traffic(traffic: Mapping[str, float] | str | Path) -> dict[str, float]:
    if isinstance(traffic, (str, Path)):
        return traffic_shares(traffic)
    return _check_shares(dict(traffic), "traffic mapping")


def metrics(
    preferences: Any,
    intents: Sequence[Any],
    traffic: Mapping[str, float] | str | Path,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    ci_method: Literal["auto", "exact", "bootstrap"] = "auto",
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    answered: Sequence[bool] | None = None,
) -> IntentMetrics:
    """Per-intent win rates (:func:`intent_win_rates`), their evidence (:func:`intent_evidence`), the
    traffic-weighted win rate and the prompt-count average (see :func:`intent_matrix_gate` for the arguments).

    Raises:
        ValueError: invalid preferences / intents or a traffic table that does not sum to 1.
    """
    traffic = _traffic(traffic)
    decisive = intent_evidence(preferences, intents, answered)
    per = intent_win_rates(preferences, intents, confidence=confidence, ci_method=ci_method, n_boot=n_boot, seed=seed)
    wr, lo, hi, covered = traffic_weighted_win_rate(
        preferences, intents, traffic, confidence=confidence, n_boot=n_boot, seed=seed
    )
    scores = preferences_to_scores(preferences)
    rows = []
    for intent in list(traffic) + [i for i in per.index if i not in traffic]:
        has = intent in per.index  # a traffic intent without data: n = 0, NaN rates
        r = per.loc[intent] if has else {}
        rows.append({
            "intent": intent, "traffic_share": traffic.get(intent, 0.0), "in_traffic_table": intent in traffic,
            **{k: int(r[k]) if has else 0 for k in ("n",)},
            **{k: float(r[k]) if has else math.nan for k in ("win_rate", "ci_low", "ci_high")},
            **{k: int(r[k]) if has else 0 for k in ("n_wins", "n_wins_base", "n_draws", "n_unannotated")},
            "ci_method": r["ci_method"] if has else None, "n_decisive": decisive.get(intent, 0),
        })
    n_total = int(scores.size)
    by_count = 100 * float(scores.mean()) if n_total else math.nan
    return IntentMetrics(tuple(rows), wr, lo, hi, covered, by_count, n_total, confidence)


def _intent_finding(row: dict[str, Any], th: IntentThresholds) -> Finding:
    """One intent's outcome under the rule (see :func:`verdict` for the codes)."""
    meaningful, n = th.meaningful(row["traffic_share"]), row["n"]
    v = {"intent": row["intent"], "share": row["traffic_share"], "n": n, "meaningful": meaningful}
    if not row["in_traffic_table"]:
        return Finding(code="not_in_traffic_table", values=v)
    if n == 0:
        return Finding(code="no_data", values=v)
    if meaningful and n < th.min_items:
        return Finding(code="too_few_items", values={**v, "min_items": th.min_items})
    if meaningful and row["n_decisive"] < th.min_items:
        return Finding(code="too_little_evidence", values={**v, "n_decisive": row["n_decisive"],
                                                           "min_items": th.min_items})
    v.update({"win_rate": row["win_rate"], "ci_low": row["ci_low"], "ci_high": row["ci_high"]})
    if row["win_rate"] < th.bar and math.isfinite(row["ci_high"]) and row["ci_high"] < th.bar:
        return Finding(code="below_bar_on_evidence", values=v)
    if row["win_rate"] < th.bar:
        return Finding(code="below_bar_noise", values=v)
    return Finding(code="ok", values=v)


def _untested(f: Finding) -> bool:
    return f.code in ("too_few_items", "too_little_evidence") or (f.code == "no_data" and f.values["meaningful"])


def verdict(m: IntentMetrics, thresholds: IntentThresholds) -> tuple[Verdict, list[Finding]]:
    """The per-intent rule, in order:
      1. no annotated item at all -> "inconclusive" (``no_annotated_items``).
      2. a meaningful intent whose interval lies wholly below ``bar`` (ci_high < bar) -> "block", on evidence
         (``below_bar_on_evidence`` with ``meaningful``).
      3. a meaningful intent with no data (``no_data``), fewer than ``min_items`` items (``too_few_items``) or
         fewer than ``min_items`` decisive answered items (``too_little_evidence``; draws and empty answers are
         not evidence) -> "inconclusive": a meaningful share of traffic is untested.
      4. otherwise "pass". Below the bar with an interval still reaching it: ``below_bar_noise``; intents below
         ``min_share`` are reported but never block; data intents without a share: ``not_in_traffic_table``.
    Findings: one per intent (table order), then ``summary`` (the traffic-weighted win rate, its interval, the
    covered share, the prompt-count average, ``min_share`` and ``bar``).
    """
    th = thresholds
    findings = [_intent_finding(r, th) for r in m.rows]
    findings.append(Finding(code="summary", values={
        "win_rate": m.win_rate, "ci_low": m.ci_low, "ci_high": m.ci_high, "covered": m.covered,
        "by_count": m.by_count, "confidence": m.confidence, "min_share": th.min_share, "bar": th.bar}))
    if m.n_total == 0:
        return "inconclusive", [Finding(code="no_annotated_items"), *findings]
    if any(f.code == "below_bar_on_evidence" and f.values["meaningful"] for f in findings):
        return "block", findings
    return ("inconclusive" if any(map(_untested, findings)) else "pass"), findings


def gate_metrics(m: IntentMetrics) -> dict[str, Metric]:
    """``traffic_weighted_win_rate`` (percent, stratified-bootstrap CI, n), ``traffic_share_covered``,
    ``win_rate_by_prompt_count_not_used`` and ``win_rate[<intent>]`` per intent with data."""
    out: dict[str, Metric] = {
        "traffic_weighted_win_rate": Metric(value=m.win_rate, ci_low=m.ci_low, ci_high=m.ci_high,
                                            n=int(sum(r["n"] for r in m.rows if r["traffic_share"] > 0)),
                                            direction="higher_is_better", unit="percent"),
        "traffic_share_covered": Metric(value=m.covered, direction="higher_is_better", unit="fraction"),
        "win_rate_by_prompt_count_not_used": Metric(value=m.by_count, n=m.n_total, direction="higher_is_better",
                                                    unit="percent"),
    }
    for r in m.rows:
        if r["n"] > 0:
            out[f"win_rate[{r['intent']}]"] = Metric(
                value=r["win_rate"], ci_low=None if math.isnan(r["ci_low"]) else r["ci_low"],
                ci_high=None if math.isnan(r["ci_high"]) else r["ci_high"], n=r["n"],
                direction="higher_is_better", unit="percent")
    return out


def gate_table(m: IntentMetrics, findings: list[Finding]) -> list[dict[str, Any]]:
    """One row per intent: :class:`IntentMetrics`'s columns plus ``meaningful`` and ``status`` (its finding, in
    words: ``gates.wording.intent_status``)."""
    per_intent = [f for f in findings if "intent" in f.values]
    rows = []
    for r, f in zip(m.rows, per_intent):
        row = {k: r[k] for k in ("intent", "traffic_share")}
        row["meaningful"] = f.values["meaningful"]
        row.update({k: v for k, v in r.items() if k not in row})
        row["status"] = wording.intent_status(f)
        rows.append(row)
    return rows


def intent_matrix_gate(
    preferences: Any,
    intents: Sequence[Any],
    traffic: Mapping[str, float] | str | Path,
    min_share: float = DEFAULT_MIN_SHARE,
    bar: float = DEFAULT_BAR,
    *,
    min_items: int = DEFAULT_MIN_ITEMS,
    confidence: float = DEFAULT_CONFIDENCE,
    ci_method: Literal["auto", "exact", "bootstrap"] = "auto",
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    answered: Sequence[bool] | None = None,
    name: str = GATE_NAME,
    judge_decision: str = "floor",
) -> GateResult:
    """Block when a cluster with a meaningful traffic share loses to the baseline on evidence.

    An intent is *meaningful* when its traffic share >= ``min_share``. The judge's floor is applied once, in the
    decision step (``gates.judge.judge_decides``). The rule is :func:`verdict`'s: no annotated item ->
    "inconclusive"; a meaningful intent wholly below ``bar`` -> "block" on evidence; a meaningful intent with fewer
    than ``min_items`` items or decisive answered items -> "inconclusive"; else "pass". Intents in the data without
    a traffic share get share 0 (reported, not weighted); traffic intents without data are reported with n = 0.

    Args:
        preferences: shape (n_items,), AlpacaEval preferences (candidate vs baseline).
        intents: shape (n_items,), intent label per item (e.g. AlpacaEval ``dataset``).
        traffic: intent -> share mapping (must sum to 1) or a path for :func:`traffic_shares`.
        min_share: fraction, default 0.05.
        bar: percent, default 50.
        min_items: items an intent needs before its interval is trusted (default 10).
        confidence, ci_method, n_boot, seed: see :func:`intent_win_rates`.
        answered: shape (n_items,), True where both answers are non-empty (None: all answered).
        judge_decision: "floor" or "corrected" (``gates.winrate_corrected``). In corrected mode, at ``bar`` = 50 the
            rule is unchanged (findings start with ``judge_decision``): under the symmetric-error model a corrected
            win rate is 50% exactly when the measured one is, for any a > 1/2, so an intent measured below 50% on
            evidence is below it corrected, and a weaker judge costs power, not validity. At another bar the
            correction would move intents across it and per-intent corrected intervals are not computed here:
            "inconclusive" (``corrected_bar_not_50``).

    Returns:
        GateResult: metrics ``traffic_weighted_win_rate`` (percent, stratified-bootstrap CI, n),
        ``traffic_share_covered`` (fraction), ``win_rate_by_prompt_count_not_used`` (percent;
        shown only to show why it is not used), and ``win_rate[<intent>]`` per intent with data
        (percent, CI, n); ``table`` has one row per intent (union of data and traffic):
        intent, traffic_share, meaningful, in_traffic_table, n, win_rate, ci_low, ci_high,
        n_wins, n_wins_base, n_draws, n_unannotated, ci_method, n_decisive, status; ``findings`` from
        :func:`verdict`.

    Raises:
        ValueError: invalid preferences / intents, a traffic table that does not sum to 1, bad
            min_share / bar / min_items.
    """
    traffic = _traffic(traffic)
    th = IntentThresholds(min_share, bar, min_items)
    m = metrics(preferences, intents, traffic, confidence=confidence, ci_method=ci_method, n_boot=n_boot, seed=seed,
                answered=answered)
    v, findings = verdict(m, th)
    table = gate_table(m, findings)
    if judge_decision == "corrected":
        mode = Finding(code="judge_decision", values={"mode": "corrected", "hard_min": HARD_MIN_AGREEMENT})
        if bar != 50.0:
            v, findings = "inconclusive", [mode, Finding(code="corrected_bar_not_50", values={"bar": bar}), *findings]
        else:
            findings = [mode, *findings]
    elif judge_decision != "floor":
        raise ValueError(f"judge_decision must be one of {list(JUDGE_DECISIONS)}, got {judge_decision!r}")
    return GateResult(name=name, version=GATE_VERSION, verdict=v, metrics=gate_metrics(m),
                      reason=wording.reason(GATE_NAME, findings), table=table, findings=findings)
