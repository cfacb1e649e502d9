"""Clustered agreement intervals on PandaLM: item-level vs cluster-aware widths, n vs n_eff, cluster counts.

PandaLM's test set compares five models' answers on 170 instructions (up to 10 pairs per instruction; 939 of its
999 rows are usable pairs), so its pairs are not independent draws. For the judge's agreement with the
annotators' majority (gpt-3.5-turbo's verdicts, the judge floor's seed measurement) and for the annotators'
agreement with each other (the PPO unlock's human side), this prints the item-level interval (what the gates
used before: Wilson on n, bootstrap over items) next to the clustered one (Wilson on the design-effect n_eff,
bootstrap over clusters; ``judging.intervals``), with n, n_eff and the cluster count, for the whole set and for
the demo's 48 held-out pairs (``recipes/demo/reward_model.yaml``: max_agreement_pairs 48).

Clusters: ``judging.agreement.pair_clusters`` (connected components of shared instruction or shared response);
the cluster count by instruction alone is printed beside it. The only target: the clustered interval is at least
as wide as the item-level one.

    PYTHONPATH=. python benchmarks/clustered_intervals.py [--shared ../shared/datasets]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

# the repository root first: run from a clone that is not installed, the script's folder (with its own ``data/``
# of labels) would otherwise shadow the project's ``data`` package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data.loaders import load_pairs  # noqa: E402
from judging.agreement import (  # noqa: E402
    expert_labels,
    inter_annotator_agreement,
    judge_agreement,
    pair_clusters,
    preference_pair_clusters,
)
from judging.intervals import cluster_bootstrap_ratio  # noqa: E402
from judging.scoring import parse_judge_verdict  # noqa: E402

INSTRUMENT = "clustered intervals"
N_RESAMPLES = 2000
DEMO_HELD_OUT = 48


def _shared(path: str | None) -> Path:
    default = os.environ.get("RLHF_SHARED_DATASETS", str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))
    return Path(path or default)


def _load(shared: Path):
    pandalm = shared / "pandalm"
    with tempfile.TemporaryDirectory() as tmp:
        pairs = list(load_pairs(str(pandalm / "testset-v1.json"), mode="lenient", max_reject_rate=0.07,
                                rejects_path=Path(tmp) / "rejects.jsonl"))
    gpt = {int(r["idx"]): parse_judge_verdict(r["gpt_result"])
           for r in json.loads((pandalm / "gpt-3.5-turbo-testset-v1.json").read_text())}
    judge = np.array([gpt[int(p.meta["idx"])] for p in pairs], dtype=np.int64)
    labels = [[lab.preference for lab in p.labels] for p in pairs]
    return pairs, judge, labels


def _width(ci) -> float:
    return float(ci.high - ci.low)


def _rows_for(name: str, pairs, judge, labels, n_resamples: int) -> list[dict]:
    clusters = preference_pair_clusters(pairs)
    by_instruction = pair_clusters([p.prompt for p in pairs])
    rows: list[dict] = []

    def row(metric: str, value: float, n: int, target: str = "", passed: bool | None = None) -> None:
        rows.append({"instrument": INSTRUMENT, "metric": metric, "value": float(value), "target": target, "n": int(n),
                     "set": name, "passed": passed})

    n_pairs = len(pairs)
    row("pairs", n_pairs, n_pairs)
    row("clusters (instruction or shared response)", int(clusters.max()) + 1, n_pairs)
    row("clusters (instruction only)", int(by_instruction.max()) + 1, n_pairs)

    # the judge's agreement with the annotators' majority (the judge floor's number)
    expert = expert_labels(np.array(labels)) if len({len(x) for x in labels}) == 1 else expert_labels(labels)
    item = judge_agreement(judge, expert)
    cl = judge_agreement(judge, expert, clusters=clusters)
    dec = (expert == 1) | (expert == 2)
    boot = cluster_bootstrap_ratio((judge[dec] == expert[dec]).astype(float), np.ones(int(dec.sum())),
                                   clusters[dec], 0.95, n_resamples, 0)
    row("judge agreement a (gpt-3.5-turbo vs majority)", cl.agreement, cl.n)
    row("judge agreement: item-level Wilson width", _width(item.ci), cl.n)
    row("judge agreement: clustered Wilson width (n_eff)", _width(cl.ci), cl.n, ">= item-level width",
        bool(_width(cl.ci) >= _width(item.ci) - 1e-12))
    row("judge agreement: cluster-bootstrap width (cross-check)", _width(boot), cl.n)
    row("judge agreement: clustered CI low", cl.ci.low, cl.n)
    row("judge agreement: item-level CI low", item.ci.low, cl.n)
    row("judge agreement: n decisive", cl.n, cl.n)
    row("judge agreement: n_eff", cl.n_eff, cl.n)
    row("judge agreement: design effect", cl.design_effect, cl.n)
    row("judge agreement: clusters among decisive pairs", cl.n_clusters, cl.n)

    # the annotators' agreement with each other (the PPO unlock's human side)
    iaa_item = inter_annotator_agreement(labels, n_resamples=n_resamples)
    iaa_cl = inter_annotator_agreement(labels, n_resamples=n_resamples, clusters=clusters)
    n_comp = iaa_cl.n_decisive_comparisons
    row("annotator agreement (decisive, pairwise)", iaa_cl.pairwise_agreement_decisive, n_comp)
    row("annotator agreement: item-bootstrap width", _width(iaa_item.pairwise_agreement_decisive_ci), n_comp)
    w_cl = _width(iaa_cl.pairwise_agreement_decisive_ci)
    row("annotator agreement: cluster-bootstrap width", w_cl, n_comp, ">= item-level width",
        bool(w_cl >= _width(iaa_item.pairwise_agreement_decisive_ci) - 1e-12))
    row("annotator agreement: n decisive comparisons", n_comp, n_comp)
    row("annotator agreement: n_eff, items as clusters", iaa_item.n_eff_decisive, n_comp)
    row("annotator agreement: n_eff, clustered", iaa_cl.n_eff_decisive, n_comp)
    row("annotator agreement: clusters", iaa_cl.n_clusters, n_pairs)
    if np.isfinite(iaa_cl.fleiss_kappa):
        w_k = _width(iaa_cl.fleiss_kappa_ci)
        row("Fleiss kappa", iaa_cl.fleiss_kappa, n_pairs)
        row("Fleiss kappa: item-bootstrap width", _width(iaa_item.fleiss_kappa_ci), n_pairs)
        row("Fleiss kappa: cluster-bootstrap width", w_k, n_pairs, ">= item-level width",
            bool(w_k >= _width(iaa_item.fleiss_kappa_ci) - 1e-12))
    return rows


def measure(shared: str | None = None, n_resamples: int = N_RESAMPLES) -> list[dict]:
    """The figures (contract: benchmarks/instruments.py): PandaLM's 939 usable pairs, then its first 48 (the demo)."""
    pairs, judge, labels = _load(_shared(shared))
    rows = _rows_for(f"pandalm/testset-v1.json ({len(pairs)} usable pairs, 3 annotators; judge gpt-3.5-turbo)",
                     pairs, judge, labels, n_resamples)
    k = DEMO_HELD_OUT
    rows += _rows_for(f"pandalm/testset-v1.json first {k} usable pairs (the demo's held-out RM pairs)",
                      pairs[:k], judge[:k], labels[:k], n_resamples)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=None, help="The shared datasets folder (default ../shared/datasets).")
    ap.add_argument("--n-resamples", type=int, default=N_RESAMPLES, help="Bootstrap resamples.")
    args = ap.parse_args(argv)
    rows = measure(args.shared, args.n_resamples)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 80)
    table = pd.DataFrame(rows)
    for name, part in table.groupby("set", sort=False):
        print(f"\n{name}")
        print(part.drop(columns=["instrument", "set"]).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
