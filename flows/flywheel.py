"""The flywheel flows: production weak signals choose what experts label; expert labels become the next round's data.

``flywheel`` (export side): ingest -> judge -> select -> scrub -> export, plus the weak-signal quality report.
``flywheel-import`` (import side): Label Studio export -> expert pairs -> decontamination -> a new dataset version
(``pairs.jsonl`` + ``agreement.jsonl`` + lineage), which ``rlhf round --flywheel-data DIR`` trains on.

Orchestration only: every computation is in the ``flywheel`` stage package. Tables go to Prefect artifacts
(``flywheel-selection-*``, ``flywheel-signal-quality-*``, ``flywheel-pii-*``, ``flywheel-import-*``) and to
``<out_dir>/report.json`` / ``report.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from rlhf.credentials import check_env_name, check_mapping, check_url, parse_mapping, redact_url
from rlhf.manifest import dumps_strict, atomic_write_text

__all__ = ["FlywheelParameters", "ImportParameters", "flywheel", "flywheel_import", "round_overrides"]


class FlywheelParameters(BaseModel):
    """Export side: which events, which judge, how many turns to label.

    Stored in Prefect's database, so they hold no secret: the database password comes from the environment
    variable ``db_password_env`` names (or PostgreSQL's own ``PGPASSWORD`` / ``~/.pgpass``), the judge's key from
    the one its ``api_key_env`` names; a password inside ``db`` or a key inside ``judge`` is refused
    (rlhf/credentials.py).
    """

    model_config = ConfigDict(hide_input_in_errors=True)  # a refused value is not echoed (it may be the secret)

    out_dir: str = Field("runs/flywheel", description="Where the store, selection, export and report go.")
    db: str | None = Field(
        None,
        description="Store URL (duckdb:///..., postgresql+psycopg://...); default a DuckDB "
        "file OUT_DIR/signals.duckdb. Never with a password in it: see db_password_env.",
    )
    db_password_env: str | None = Field(
        None,
        description="NAME of the environment variable holding the database password (default: none; PostgreSQL's "
        "driver then reads PGPASSWORD or ~/.pgpass itself).",
    )
    events: list[str] = Field(default_factory=list, description="Event files to ingest (.jsonl / .parquet).")
    reward_model_dir: str | None = Field(
        None, description="The round's reward-model stage dir or checkpoint (the reward_model judge backend's model)."
    )
    judge: dict | str | None = Field(
        None,
        description="The gates' judge (judging.judges.JudgeConfig: the gates recipe's judge: mapping or its JSON); "
        "default: judge of gates_recipe, else the reward_model backend.",
    )
    gates_recipe: str | None = Field(None, description="Take the judge from this gates recipe's judge: key.")
    judge_reference: str | None = Field(None, description="Reply A each turn is compared with (flywheel.judge).")
    traffic_data: str = Field("demo:traffic/alpaca_eval_clusters.csv", description="Traffic table (intent,share).")
    budget_fraction: float = Field(0.005, ge=0.0, le=1.0, description="Share of turns to label (default 0.5%).")
    budget: StrictInt | None = Field(
        None, ge=0, description="Number of turns to label (overrides budget_fraction); never exceeded."
    )
    floor: StrictInt = Field(
        1, ge=0, description="Turns each intent with candidates gets at least, as far as the budget holds them."
    )
    k: int = Field(2, description="Responses per selected turn (C(k,2) pairwise tasks).")
    alternatives: str | None = Field(None, description="alternatives.jsonl: responses per turn (the simulator's).")
    policy_dir: str | None = Field(None, description="Sample the missing responses from this policy (on-policy).")
    max_new_tokens: int = Field(64, description="Cap per sampled response.")
    expert_labels: str | None = Field(None, description="Expert verdicts per turn for the weak-signal quality table.")
    judge_batch_size: int = 8
    judge_max_length: int = 512

    @field_validator("db")
    @classmethod
    def _db_without_password(cls, value: str | None) -> str | None:
        return value if value is None else check_url(value, "db", "db_password_env (or PGPASSWORD)")

    @field_validator("db_password_env")
    @classmethod
    def _password_env_is_a_name(cls, value: str | None) -> str | None:
        return value if value is None else check_env_name(value, "db_password_env")

    @field_validator("judge")
    @classmethod
    def _judge_without_key(cls, value: dict | str | None) -> dict | str | None:
        check_mapping(parse_mapping(value, where="judge"), "judge")
        return value


class ImportParameters(BaseModel):
    """Import side: the labels that came back."""

    export_dir: str = Field(..., description="The flywheel's export directory (tasks.json, export.json).")
    labels: str = Field(..., description="Label Studio JSON export of those tasks.")
    out_dir: str = Field("runs/flywheel/datasets", description="Dataset versions go here (v-HASH/).")
    gate_generations: str | None = Field(
        None, description="runs/ROUND/gates/generations.jsonl: decontaminate against the prompts the round's gates sent."
    )
    gates_recipe: str | None = Field(
        None,
        description="Or: decontaminate against every prompt of the suite files a gate recipe (or a round's "
        "gate_suites.yaml) names.",
    )
    heldout_fraction: float = Field(0.3, description="Share of labelled tasks kept as agreement data (not trained).")


def _key(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")[:60] or "flywheel"


@task(cache_policy=NO_CACHE)
def ingest_task(db: str, files: list[str], password_env: str | None = None) -> list[dict]:
    import dataclasses

    from flywheel.store import SignalStore

    store = SignalStore(db, password_env=password_env)
    reports = [dataclasses.asdict(r) for r in store.ingest_files(files)]
    store.close()
    return reports


@task(cache_policy=NO_CACHE)
def judge_task(db: str, params: FlywheelParameters) -> dict:
    from flywheel.judge import DEFAULT_REFERENCE, gates_judge, judge_turns
    from flywheel.store import SignalStore
    from judging.judges import JudgeConfig

    store = SignalStore(db, password_env=params.db_password_env)
    config = params.judge
    if config is None and params.gates_recipe:
        import yaml

        config = (yaml.safe_load(Path(params.gates_recipe).read_text()) or {}).get("judge")
    config = parse_mapping(config, where="judge") or {"backend": "reward_model"}
    config = {"batch_size": params.judge_batch_size, "max_length": params.judge_max_length, **config}
    judge = gates_judge(
        config, reward_model=params.reward_model_dir, reference=params.judge_reference or DEFAULT_REFERENCE
    )
    out = {"judge": judge.id, "judge_config": JudgeConfig.from_dict(config).to_dict(), **judge_turns(store, judge)}
    store.close()
    return out


@task(cache_policy=NO_CACHE)
def select_task(db: str, judge_id: str, params: FlywheelParameters, out: Path):
    from data.bundle import demo_path
    from flywheel.select import SelectionConfig, load_traffic
    from flywheel.select_store import select_from_store
    from flywheel.store import SignalStore
    from rlhf.lineage import json_hash

    src = params.traffic_data
    traffic = load_traffic(demo_path(src[5:]) if src.startswith("demo:") else src)
    store = SignalStore(db, password_env=params.db_password_env)
    sel = select_from_store(
        store,
        traffic,
        SelectionConfig(budget_fraction=params.budget_fraction, budget=params.budget, floor=params.floor),
        judge=judge_id,
    )
    store.close()
    cols = [
        "user_id",
        "conversation_id",
        "turn_id",
        "intent",
        "kind",
        "disagreement",
        "q",
        "judge_score",
        "thumbs_up",
        "thumbs_down",
        "regenerate",
        "prompt_hash",
        "response_hash",
    ]
    rows = json.loads(sel.selected[cols].to_json(orient="records"))
    atomic_write_text(out / "selection.jsonl", "".join(dumps_strict(r) + "\n" for r in rows))
    summary = {
        "n_turns": sel.n_turns,
        "n_scored": sel.n_scored,
        "n_candidates": sel.n_candidates,
        "n_duplicates": sel.n_duplicates,
        "budget": sel.budget,
        "n_selected": len(rows),
        "floors_not_met": sel.floors_not_met,
        "by_kind": sel.by_kind,
        "by_intent": sel.by_intent,
        "selection_hash": json_hash(rows),
    }
    return rows, summary


@task(cache_policy=NO_CACHE)
def quality_task(db: str, labels_path: str, password_env: str | None = None) -> list[dict]:
    from flywheel.quality import expert_verdicts, signal_quality
    from flywheel.schema import SIGNALS
    from flywheel.store import SignalStore

    store = SignalStore(db, password_env=password_env)
    turns = store.turns_frame(columns=["conversation_id", "turn_id", *SIGNALS])
    store.close()
    lines = Path(labels_path).read_text().splitlines()
    return signal_quality(turns, expert_verdicts(json.loads(x) for x in lines if x.strip()))


def _responses_provider(db: str, params: FlywheelParameters):
    """turn -> [its own response, alternatives...] from the simulator's alternatives file and/or policy samples."""
    from flywheel.store import SignalStore

    alts: dict[tuple[str, int], list[str]] = {}
    if params.alternatives:
        for line in Path(params.alternatives).read_text().splitlines():
            row = json.loads(line)
            alts[(row["conversation_id"], int(row["turn_id"]))] = row["responses"]
    store = SignalStore(db, password_env=params.db_password_env)
    sampler = None
    if params.policy_dir:
        from flywheel.responses import PolicySampler

        sampler = PolicySampler(params.policy_dir, max_new_tokens=params.max_new_tokens)

    def responses(turn: dict) -> list[str]:
        seen = history(turn)
        if not seen:
            return []
        own = seen[-1]
        texts = [own["response"]] + [
            r for r in alts.get((turn["conversation_id"], int(turn["turn_id"])), []) if r != own["response"]
        ]
        if sampler is not None and len(texts) < params.k:
            messages = []
            for x in seen:  # the history the user saw, then this turn's prompt
                messages.append({"role": "user", "content": x["prompt"]})
                if x is not own:
                    messages.append({"role": "assistant", "content": x["response"]})
            texts += sampler.sample(messages, params.k - len(texts))
        return texts

    def history(turn: dict) -> list[dict]:
        return store.history(turn["user_id"], turn["conversation_id"], int(turn["turn_id"]), turn["response_hash"])

    return store, history, responses


@task(cache_policy=NO_CACHE)
def export_task(db: str, rows: list[dict], params: FlywheelParameters, out: Path, selection_hash: str) -> dict:
    from flywheel.annotation import build_tasks, write_export
    from flywheel.scrub import Scrubber

    store, history, responses = _responses_provider(db, params)
    scrubber = Scrubber()
    export = build_tasks(rows, history, responses, k=params.k, scrub=scrubber.scrub)
    store.close()
    export.scrub = scrubber.manifest()
    manifest = write_export(export, out / "export", selection_hash=selection_hash)
    manifest["recognizers"] = scrubber.recognizers
    return manifest


@flow(name="flywheel", log_prints=True)
def flywheel(params: FlywheelParameters) -> dict:
    """Ingest -> judge -> select -> scrub -> export. Returns the report (also ``<out_dir>/report.json``)."""
    logger = get_run_logger()
    out = Path(params.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").unlink(missing_ok=True)  # written last: a failed run leaves none that looks current
    db = params.db or str(out / "signals.duckdb")
    ingested = ingest_task(db, params.events, params.db_password_env)
    judged = judge_task(db, params)
    rows, selection = select_task(db, judged["judge"], params, out)
    quality = quality_task(db, params.expert_labels, params.db_password_env) if params.expert_labels else []
    export = export_task(db, rows, params, out, selection["selection_hash"])
    report = {
        "db": redact_url(db),  # never a password (refused in db), hidden here all the same
        "ingested": ingested,
        "judge": judged,
        "selection": selection,
        "signal_quality": quality,
        "export": export,
    }
    atomic_write_text(out / "report.json", dumps_strict(report, indent=2, default=str))
    atomic_write_text(out / "report.md", _markdown(report))
    key = _key(out.name)
    create_table_artifact(
        key=f"flywheel-selection-{key}",
        table=[{"group": "intent", "name": k, **v} for k, v in selection["by_intent"].items()]
        + [{"group": "kind", "name": k, **v} for k, v in selection["by_kind"].items()],
        description=f"Disagreement selection: {selection['n_selected']} of {selection['n_turns']} turns",
    )
    if quality:
        create_table_artifact(
            key=f"flywheel-signal-quality-{key}",
            table=quality,
            description="Weak-signal agreement with expert verdicts (Wilson 95% CI)",
        )
    create_table_artifact(
        key=f"flywheel-pii-{key}",
        table=[{"entity": k, "replaced": v} for k, v in export["pii_counts"].items()]
        or [{"entity": "(none found)", "replaced": 0}],
        description="Personal data replaced before export",
    )
    logger.info(
        "flywheel: %d of %d turns selected, %d tasks exported to %s",
        selection["n_selected"],
        selection["n_turns"],
        export["tasks"],
        out / "export" / "tasks.json",
    )
    return report


def _markdown(report: dict) -> str:
    sel, exp = report["selection"], report["export"]
    lines = [
        "# Flywheel report",
        "",
        (
            f"Turns {sel['n_turns']} (scored {sel['n_scored']}), disagreement candidates {sel['n_candidates']} "
            f"({sel['n_duplicates']} duplicate prompts), budget {sel['budget']}, selected {sel['n_selected']}."
        ),
        "",
        "| intent | share | quota | candidates | selected |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {k} | {v['share']} | {v['quota']} | {v['candidates']} | {v['selected']} |"
        for k, v in sel["by_intent"].items()
    ]
    lines += ["", "| disagreement kind | candidates | selected |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['candidates']} | {v['selected']} |" for k, v in sel["by_kind"].items()]
    if report["signal_quality"]:
        lines += [
            "",
            "Weak-signal agreement with expert verdicts (Wilson 95% CI):",
            "",
            "| signal | implies | n | agreement | CI |",
            "|---|---|---:|---:|---|",
        ]
        lines += [
            f"| {q['signal']} | {q['implies']} | {q['n']} | {q['agreement']} | [{q['ci_low']}, {q['ci_high']}] |"
            for q in report["signal_quality"]
        ]
    lines += [
        "",
        f"Exported {exp['tasks']} pairwise tasks for {exp['turns']} turns; skipped {len(exp['skipped'])}.",
        "Personal data replaced: " + (", ".join(f"{k} {v}" for k, v in exp["pii_counts"].items()) or "none"),
        "",
    ]
    return "\n".join(lines)


@flow(name="flywheel-import", log_prints=True)
def flywheel_import(params: ImportParameters) -> dict:
    """Label Studio export -> expert pairs -> decontamination -> dataset version. Returns its manifest."""
    from data.decontamination import suites_from_gates_recipe, suites_from_generations
    from flywheel.annotation import decontaminate_pairs, read_label_studio_labels, write_dataset_version
    from rlhf.lineage import file_hash

    logger = get_run_logger()
    export_dir = Path(params.export_dir)
    tasks = json.loads((export_dir / "tasks.json").read_text())
    exported = json.loads((export_dir / "export.json").read_text())
    got = read_label_studio_labels(params.labels, tasks)
    pairs, unlabelled = got.pairs, got.unlabelled
    suites: dict[str, list[str]] = {}
    if params.gate_generations:
        suites.update(suites_from_generations(params.gate_generations))
    if params.gates_recipe:
        for name, prompts in suites_from_gates_recipe(params.gates_recipe).items():
            suites.setdefault(name, []).extend(prompts)
    if not suites:
        raise ValueError(
            "flywheel-import: no gate suites to decontaminate against; pass gate_generations "
            "(runs/<r>/gates/generations.jsonl) or gates_recipe"
        )
    kept, report = decontaminate_pairs(pairs, suites)
    lineage = {
        "selection": exported["selection_hash"],
        "export": exported["export_hash"],
        "labels": file_hash(params.labels),
    }
    manifest = write_dataset_version(
        kept,
        unlabelled,
        params.out_dir,
        lineage=lineage,
        decontamination=report,
        heldout_fraction=params.heldout_fraction,
        unlabelled_annotations=got.unlabelled_annotations,
        repeated_annotations=got.repeated_annotations,
        require_pairs=True,
    )
    create_table_artifact(
        key=f"flywheel-import-{manifest['version']}",
        table=[
            {
                k: manifest[k]
                for k in (
                    "version",
                    "n_labelled_tasks",
                    "n_pairs",
                    "n_no_majority_or_tie",
                    "n_agreement_rows",
                    "n_unlabelled_tasks",
                )
            }
            | {"decontaminated": report["n_removed"]}
        ],
        description=f"Dataset version {manifest['version']} from {params.labels}",
    )
    logger.info(
        "flywheel-import: %d labelled tasks, %d unlabelled, %d removed by decontamination, %d pairs, "
        "%d agreement rows -> %s",
        len(pairs),
        len(unlabelled),
        report["n_removed"],
        manifest["n_pairs"],
        manifest["n_agreement_rows"],
        manifest["dir"],
    )
    return manifest


def round_overrides(flywheel_data: str, *, min_agreement_rows: int = 8) -> dict[str, list[str]]:
    """The round's stage overrides that make a flywheel dataset version its DPO and reward-model data.

    ``dpo.train_data`` and ``reward_model.train_data`` = the version's ``pairs.jsonl``; ``reward_model.
    agreement_data`` = its ``agreement.jsonl`` when it has at least ``min_agreement_rows`` rows (else the recipe's
    stays, and the round log says so).

    Raises:
        FileNotFoundError: no ``manifest.json`` in ``flywheel_data``. ValueError: the version has no pairs.
    """
    path = Path(flywheel_data) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{flywheel_data}: not a flywheel dataset version (no manifest.json)")
    m = json.loads(path.read_text())
    if not m.get("n_pairs"):
        raise ValueError(f"{flywheel_data}: the dataset version has no training pairs")
    out = {"dpo": ["--train_data", m["pairs"]], "reward_model": ["--train_data", m["pairs"]]}
    if m.get("n_agreement_rows", 0) >= min_agreement_rows:
        out["reward_model"] += ["--agreement_data", m["agreement"]]
    return out
