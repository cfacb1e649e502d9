"""Traffic simulator: production-like conversations with weak signals, for the demo and the tests.

Prompts come from the bundled AlpacaEval annotations (805 real instructions in 5 intent clusters, each with two
responses -- the GPT-4-turbo baseline and GPT-3.5-turbo -- and a judged preference between them), drawn by intent in
the traffic table's proportions. A conversation has 1..``max_turns`` turns (each further turn with probability
``p_continue``); later turns ask another question of the same intent. A turn's response is, in order of
preference: the round candidate's stored gate generation for that prompt (``runs/<r>/gates/generations.jsonl``;
an empty generation is skipped), or one of the two bundled responses.

Each turn has a simulated expert verdict (``expert_bad``): for a bundled response, whether the preference judged it
the worse of the two; for a candidate generation (no held label), a draw with ``generation_bad_rate``. The weak
signals then follow, with the noise production signals have:

* thumbs-down: on a refusal or a long answer a user is ``refusal_boost`` / ``long_boost`` times as likely to click
  it whatever its quality; the two base rates are solved so that over the simulated turns ``P(thumbs-down) =
  thumbs_down_rate`` and ``P(expert bad | thumbs-down) = thumbs_down_precision`` (default 0.55, the seed figure);
* thumbs-up, copy, edit, regenerate: rates that depend on the expert verdict (``*_good`` / ``*_bad``);
* abandon: the last turn of a conversation ends in ``abandon`` with ``abandon_bad`` / ``abandon_good``;
  ``continued`` marks every turn the user followed up on.

Outputs: ``events.jsonl`` (:class:`flywheel.schema.EventRow` rows), ``expert_labels.jsonl`` (the verdict per turn,
for the weak-signal quality report; only a ``labelled_fraction`` of turns, as in production) and
``alternatives.jsonl`` (per turn: every response it could have had, its own first, with their held verdicts: the
annotation export's k responses and the simulated annotators' ground truth). The realised rates are returned and printed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from rlhf.manifest import atomic_write_text

__all__ = ["SimulatorConfig", "is_refusal", "load_simulator_config", "main", "simulate"]

_REFUSAL = re.compile(
    r"\b(i can(?:no|')t|i cannot|i am unable|i'm unable|i won't|i will not|i'm sorry|i am sorry|as an ai)\b",
    re.IGNORECASE,
)
_PII_SNIPPETS = [
    "My email is {first}.{last}@example.com if you need it.",
    "You can call me at +1 415 555 01{n:02d}.",
    "My name is {First} {Last}.",
    "I live at {n} Elm Street, Springfield.",
]
_NAMES = [("Jane", "Doe"), ("Omar", "Haddad"), ("Li", "Wei"), ("Maria", "Garcia"), ("Tom", "Baker")]


def is_refusal(text: str) -> bool:
    """A phrase-list refusal detector (the simulator's user reaction, not a gate instrument)."""
    return bool(_REFUSAL.search(text[:300]))


@dataclass
class SimulatorConfig:
    """Parameters of the simulator (a YAML file; see ``recipes/flywheel/simulator.yaml``)."""

    seed: int = 0
    n_conversations: int = 500
    max_turns: int = 4
    p_continue: float = 0.35
    n_users: int = 200
    model_version: str = "round-1"
    start: str = "2026-03-01T00:00:00+00:00"
    prompts: str = "demo:alpaca_eval/annotations/gpt-3.5-turbo-1106.jsonl.gz"
    traffic_data: str = "demo:traffic/alpaca_eval_clusters.csv"
    generations: str | None = None  # runs/<r>/gates/generations.jsonl: the candidate's answers where available
    generation_bad_rate: float = 0.5
    thumbs_down_rate: float = 0.12
    thumbs_down_precision: float = 0.55
    refusal_boost: float = 3.0
    long_chars: int = 1500
    long_boost: float = 1.5
    thumbs_up_good: float = 0.12
    thumbs_up_bad: float = 0.04
    regenerate_good: float = 0.03
    regenerate_bad: float = 0.10
    copy_good: float = 0.15
    copy_bad: float = 0.05
    edit_good: float = 0.02
    edit_bad: float = 0.05
    abandon_good: float = 0.10
    abandon_bad: float = 0.30
    labelled_fraction: float = 1.0
    pii_rate: float = 0.05
    expert_id: str = "held-label:alpaca_eval"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and f.name not in ("refusal_boost", "long_boost") and not 0.0 <= v <= 1.0:
                raise ValueError(f"simulator config: {f.name} must be in [0, 1], got {v}")


def load_simulator_config(path: str | Path | None, **overrides) -> SimulatorConfig:
    """Read a YAML parameter file (unknown keys are errors) and apply ``overrides``.

    Raises:
        ValueError: an unknown key or a rate outside [0, 1], naming the file.
    """
    data = yaml.safe_load(Path(path).read_text()) if path else {}
    data = {**(data or {}), **{k: v for k, v in overrides.items() if v is not None}}
    known = {f.name for f in dataclasses.fields(SimulatorConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown simulator key(s) {unknown}; known: {sorted(known)}")
    return SimulatorConfig(**data)


def _pool(cfg: SimulatorConfig) -> tuple[dict[str, list[dict]], dict[str, float]]:
    """(``{intent: [{"id", "prompt", "responses": [(text, expert_bad, source)], "candidate"}]}``, traffic)."""
    from data.bundle import demo_path
    from data.loaders import load_alpaca_eval

    from .select import load_traffic

    gens: dict[str, str] = {}
    if cfg.generations:
        for line in Path(cfg.generations).read_text().splitlines():
            row = json.loads(line)
            # An empty generation is no answer a user could react to: those prompts keep the bundled answers.
            if row.get("suite") == "winrate" and isinstance(row.get("prompt"), str) and row["candidate"].strip():
                gens[row["id"]] = row["candidate"]
    pool: dict[str, list[dict]] = {}
    for rec in load_alpaca_eval(cfg.prompts):
        if rec.preference is None:
            continue
        # preference in [1, 2]: < 1.5 the baseline (output_1) was preferred, > 1.5 output_2; 1.5 a draw (both good)
        responses = [
            (rec.output_1, rec.preference > 1.5, rec.generator_1 or "output_1"),
            (rec.output_2, rec.preference < 1.5, rec.generator_2 or "output_2"),
        ]
        item = {"id": rec.id, "prompt": rec.instruction, "responses": responses, "candidate": gens.get(rec.id)}
        pool.setdefault(rec.dataset or "unknown", []).append(item)
    traffic_path = cfg.traffic_data
    traffic = load_traffic(demo_path(traffic_path[5:]) if traffic_path.startswith("demo:") else traffic_path)
    missing = [k for k in traffic if k not in pool]
    if missing:
        raise ValueError(f"{cfg.prompts}: no prompts for traffic intent(s) {missing}")
    return {k: pool[k] for k in traffic}, traffic


def _plant_pii(rng, text: str) -> str:
    first, last = _NAMES[rng.integers(len(_NAMES))]
    snippet = _PII_SNIPPETS[rng.integers(len(_PII_SNIPPETS))]
    return f"{text} {snippet.format(first=first.lower(), last=last.lower(), First=first, Last=last, n=int(rng.integers(1, 99)))}"


def simulate(cfg: SimulatorConfig, out_dir: str | Path) -> dict:
    """Simulate production traffic into ``out_dir`` (see module docstring).

    Returns:
        the realised rates: ``turns``, ``conversations``, ``events``, ``intent_share`` (per intent), ``signal_rate``
        (per signal, per turn), ``thumbs_down_precision`` (P(expert bad | thumbs-down) over labelled turns),
        ``thumbs_down_rate_refusal`` / ``_other``, ``thumbs_down_rate_long`` / ``_short``, ``abandon_rate``
        (per conversation), ``expert_bad_rate``, ``mean_turns``. Also written to ``out_dir/simulation.json``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    pool, traffic = _pool(cfg)
    intents = list(traffic)
    p = np.array([traffic[k] for k in intents], dtype=float)
    p = p / p.sum()
    start = dt.datetime.fromisoformat(cfg.start)

    # 1. conversations and turns (responses and expert verdicts)
    turns: list[dict] = []
    for c in range(cfg.n_conversations):
        intent = intents[rng.choice(len(intents), p=p)]
        n_turns = 1
        while n_turns < cfg.max_turns and rng.random() < cfg.p_continue:
            n_turns += 1
        items = [pool[intent][i] for i in rng.choice(len(pool[intent]), size=n_turns, replace=False)]
        user = f"user-{rng.integers(cfg.n_users):05d}"
        t0 = start + dt.timedelta(seconds=int(rng.integers(0, 7 * 86400)))
        for t, item in enumerate(items):
            if item["candidate"] is not None:
                text, bad, source = item["candidate"], bool(rng.random() < cfg.generation_bad_rate), cfg.model_version
            else:
                text, bad, source = item["responses"][rng.integers(2)]
            prompt = item["prompt"]
            if rng.random() < cfg.pii_rate:
                prompt = _plant_pii(rng, prompt)
            turns.append(
                {
                    "conversation_id": f"conv-{cfg.seed}-{c:06d}",
                    "turn_id": t,
                    "last": t == n_turns - 1,
                    "user_id": user,
                    "intent": intent,
                    "item_id": item["id"],
                    "prompt": prompt,
                    "response": text,
                    "response_source": source,
                    "expert_bad": bool(bad),
                    "refusal": is_refusal(text),
                    "long": len(text) > cfg.long_chars,
                    "ts": t0 + dt.timedelta(seconds=60 * t),
                }
            )
    n = len(turns)
    bad = np.array([t["expert_bad"] for t in turns])
    w = (
        1.0
        + (cfg.refusal_boost - 1.0) * np.array([t["refusal"] for t in turns])
        + (cfg.long_boost - 1.0) * np.array([t["long"] for t in turns])
    )
    # 2. thumbs-down base rates solved for the target rate and precision:
    #    sum_bad(c_bad * w) = precision * rate * n  and  sum_good(c_good * w) = (1 - precision) * rate * n
    c_bad = cfg.thumbs_down_precision * cfg.thumbs_down_rate * n / max(w[bad].sum(), 1e-9)
    c_good = (1 - cfg.thumbs_down_precision) * cfg.thumbs_down_rate * n / max(w[~bad].sum(), 1e-9)
    p_down = np.clip(np.where(bad, c_bad, c_good) * w, 0.0, 1.0)

    events: list[dict] = []
    for i, t in enumerate(turns):
        b = t["expert_bad"]
        fired = []
        if rng.random() < p_down[i]:
            fired.append("thumbs_down")
        elif rng.random() < (cfg.thumbs_up_bad if b else cfg.thumbs_up_good):
            fired.append("thumbs_up")
        for sig in ("regenerate", "copy", "edit"):
            if rng.random() < getattr(cfg, f"{sig}_{'bad' if b else 'good'}"):
                fired.append(sig)
        if not t["last"]:
            fired.append("continued")
        elif rng.random() < (cfg.abandon_bad if b else cfg.abandon_good):
            fired.append("abandon")
        for k, sig in enumerate(fired):
            events.append(
                {
                    "event_id": f"{t['conversation_id']}-{t['turn_id']}-{sig}",
                    "conversation_id": t["conversation_id"],
                    "turn_id": t["turn_id"],
                    "user_id": t["user_id"],
                    "model_version": cfg.model_version,
                    "intent": t["intent"],
                    "signal": sig,
                    "timestamp": (t["ts"] + dt.timedelta(seconds=5 + k)).isoformat(),
                    "prompt": t["prompt"],
                    "response": t["response"],
                }
            )
            t.setdefault("signals", []).append(sig)

    labelled = rng.random(n) < cfg.labelled_fraction
    atomic_write_text(out / "events.jsonl", "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events))
    atomic_write_text(
        out / "expert_labels.jsonl",
        "".join(
            json.dumps(
                {
                    "conversation_id": t["conversation_id"],
                    "turn_id": t["turn_id"],
                    "annotator_id": cfg.expert_id,
                    "verdict": "bad" if t["expert_bad"] else "good",
                }
            )
            + "\n"
            for t, lab in zip(turns, labelled)
            if lab
        ),
    )
    # Every response the turn could have had (its own first), with the held verdict of each (None: no held label):
    # the annotation export's k responses per selected turn, and the simulated annotators' ground truth.
    alt_rows = []
    for t in turns:
        item = next(x for x in pool[t["intent"]] if x["id"] == t["item_id"])
        cands = [(r[0], bool(r[1])) for r in item["responses"]]
        if item["candidate"] is not None:
            cands.append((item["candidate"], None))
        own = [c for c in cands if c[0] == t["response"]][:1] or [(t["response"], t["expert_bad"])]
        rest = [c for c in cands if c[0] != t["response"]]
        alt_rows.append(
            {
                "conversation_id": t["conversation_id"],
                "turn_id": t["turn_id"],
                "item_id": t["item_id"],
                "responses": [c[0] for c in own + rest],
                "expert_bad": [t["expert_bad"]] + [c[1] for c in rest],
            }
        )
    atomic_write_text(out / "alternatives.jsonl", "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in alt_rows))
    rates = _realised(cfg, turns, events, labelled)
    atomic_write_text(
        out / "simulation.json", json.dumps({"config": dataclasses.asdict(cfg), "realised": rates}, indent=2)
    )
    return rates


def _realised(cfg: SimulatorConfig, turns: list[dict], events: list[dict], labelled: np.ndarray) -> dict:
    n = len(turns)
    has = lambda t, s: s in t.get("signals", [])
    down = np.array([has(t, "thumbs_down") for t in turns])
    bad = np.array([t["expert_bad"] for t in turns])
    refusal = np.array([t["refusal"] for t in turns])
    long = np.array([t["long"] for t in turns])
    lab_down = down & labelled

    def rate(mask_num, mask_den):
        d = int(mask_den.sum())
        return round(float((mask_num & mask_den).sum() / d), 4) if d else None

    convs = Counter(t["conversation_id"] for t in turns)
    last = np.array([t["last"] for t in turns])
    intents = Counter(t["intent"] for t in turns if t["turn_id"] == 0)
    return {
        "conversations": len(convs),
        "turns": n,
        "events": len(events),
        "mean_turns": round(n / max(len(convs), 1), 3),
        "intent_share": {k: round(v / max(len(convs), 1), 4) for k, v in sorted(intents.items())},
        "signal_rate": {
            s: round(sum(has(t, s) for t in turns) / max(n, 1), 4)
            for s in ("thumbs_up", "thumbs_down", "regenerate", "edit", "copy", "abandon", "continued")
        },
        "thumbs_down_precision": rate(bad, lab_down),
        "thumbs_down_precision_configured": cfg.thumbs_down_precision,
        "thumbs_down_rate_refusal": rate(down, refusal),
        "thumbs_down_rate_other": rate(down, ~refusal),
        "thumbs_down_rate_long": rate(down, long),
        "thumbs_down_rate_short": rate(down, ~long),
        "abandon_rate": rate(np.array([has(t, "abandon") for t in turns]), last),
        "expert_bad_rate": round(float(bad.mean()), 4) if n else None,
        "responses_from_candidate": sum(t["response_source"] == cfg.model_version for t in turns),
    }


def held_truth(alternatives: str | Path) -> Callable[[dict], int | None]:
    """task data -> true verdict (1 A better, 2 B better, 0 tie) from ``alternatives.jsonl``'s held verdicts:
    the good response beats the bad one; two of the same verdict are a tie; ``None`` where a response has no held
    verdict (a candidate generation)."""
    bad: dict[tuple[str, int], list] = {}
    for line in Path(alternatives).read_text().splitlines():
        row = json.loads(line)
        bad[(row["conversation_id"], int(row["turn_id"]))] = row["expert_bad"]

    def truth(data: dict) -> int | None:
        flags = bad.get((data["conversation_id"], int(data["turn_id"])))
        if flags is None:
            return None
        a, b = flags[data["response_index_a"]], flags[data["response_index_b"]]
        if a is None or b is None:
            return None
        return 0 if a == b else (2 if a else 1)

    return truth


def main(argv: list[str] | None = None) -> int:
    """``python -m flywheel.simulate --config recipes/flywheel/simulator.yaml --out DIR [--generations FILE]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m flywheel.simulate")
    ap.add_argument("--config", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--generations", default=None)
    ap.add_argument("--n-conversations", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--model-version", default=None)
    a = ap.parse_args(argv)
    cfg = load_simulator_config(
        a.config,
        generations=a.generations,
        n_conversations=a.n_conversations,
        seed=a.seed,
        model_version=a.model_version,
    )
    print(json.dumps(simulate(cfg, a.out), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
