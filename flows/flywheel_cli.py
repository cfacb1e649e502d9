"""``rlhf flywheel ...``: simulate traffic, ingest events, select and export for annotation, import labels.

rlhf flywheel simulate --out runs/fw/sim [--generations runs/r1/gates/generations.jsonl]
rlhf flywheel ingest --db runs/fw/signals.duckdb runs/fw/sim/events.jsonl
rlhf flywheel export --out-dir runs/fw --events runs/fw/sim/events.jsonl --reward-model runs/r1/reward_model
rlhf flywheel annotate-sim --export-dir runs/fw/export --alternatives runs/fw/sim/alternatives.jsonl --out labels.json
rlhf flywheel import --export-dir runs/fw/export --labels labels.json --gate-generations runs/r1/gates/generations.jsonl
rlhf round --preset demo --flywheel-data runs/flywheel/datasets/v-<hash>

Exit codes of every command: 0 done; 1 an error, printed as one line on stderr (``error: FILE row N field 'F':
reason`` for bad input); 2 a usage error (a bad option value: negative budget, fraction out of [0, 1], ...);
130 interrupted (Ctrl-C / SIGTERM; ``ingest`` stops between batches and rolls back the file it was in).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rlhf.manifest import dumps_strict

app = typer.Typer(
    help="The flywheel: weak signals select what experts label; expert labels train the next round.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.command("simulate")
def simulate_cmd(
    out: Annotated[str, typer.Option(help="Output folder (events.jsonl, expert_labels.jsonl, alternatives.jsonl).")],
    config: Annotated[
        str, typer.Option(help="Simulator parameters (YAML); default: the installed recipes/flywheel/simulator.yaml.")
    ] = str(Path(__file__).resolve().parent.parent / "recipes" / "flywheel" / "simulator.yaml"),
    generations: Annotated[str | None, typer.Option(help="The candidate's gates/generations.jsonl.")] = None,
    n_conversations: Annotated[int | None, typer.Option(help="Override the number of conversations.")] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    model_version: Annotated[str | None, typer.Option(help="Model version recorded on the events.")] = None,
) -> None:
    """Simulate production traffic with weak signals; prints the realised rates."""
    from flywheel.simulate import load_simulator_config, simulate

    def run(_):
        cfg = load_simulator_config(
            config, generations=generations, n_conversations=n_conversations, seed=seed, model_version=model_version
        )
        return simulate(cfg, out)

    typer.echo(dumps_strict(_run(run, None), indent=2))


@app.command("ingest")
def ingest_cmd(
    files: Annotated[list[str], typer.Argument(help="Event files (.jsonl / .parquet).")],
    db: Annotated[str, typer.Option(help="duckdb:///file, postgresql+psycopg://user@host/db, or a file path; "
                                    "never with a password (see --db-password-env).")],
    db_password_env: Annotated[
        str | None, typer.Option(help="NAME of the environment variable holding the database password (default: "
                                 "PGPASSWORD or ~/.pgpass, read by PostgreSQL's driver).")
    ] = None,
    chunk_rows: Annotated[int | None, typer.Option(min=1, help="Rows per loaded batch (default by file type).")] = None,
    lock_timeout: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for another process holding a DuckDB store.")
    ] = 60.0,
) -> None:
    """Ingest event files into the store (each file one transaction); prints per-file reports and counts. Exit 1
    on a bad row (one line: file, row, field, reason; that file rolled back), 130 on Ctrl-C (stops between
    batches, the current file rolled back)."""
    from flywheel.ingest import main

    extra = ["--chunk-rows", str(chunk_rows)] if chunk_rows else []
    extra += ["--db-password-env", db_password_env] if db_password_env else []
    raise typer.Exit(main(["--db", db, "--lock-timeout", str(lock_timeout), *extra, *files]))


def _run(flow_fn, params):
    """``flow_fn(params)``; a known error becomes one ``error:`` line and exit 1, an interrupt exit 130."""
    from data.validation import DataValidationError
    from flywheel.annotation import AnnotationImportError
    from flywheel.store import FileChangedError, IngestInterrupted, StoreLockedError

    try:
        return flow_fn(params)
    except (KeyboardInterrupt, IngestInterrupted) as err:
        typer.echo(f"error: interrupted ({err or 'SIGINT'})", err=True)
        raise typer.Exit(130) from None
    except (
        DataValidationError, AnnotationImportError, FileChangedError, StoreLockedError, ValueError, OSError, KeyError
    ) as err:
        text = " ".join(str(err).split()) or type(err).__name__
        typer.echo(f"error: {text}", err=True)
        raise typer.Exit(1) from None


def _params(model, **values):
    """Build flow parameters; a refused value (a secret given where a variable's name goes, a bad field) is one
    line naming the field, never the value, and exit 2, before the flow run (and Prefect's record of it) exists."""
    from pydantic import ValidationError

    try:
        return model(**values)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or model.__name__
        typer.echo(f"error: {field}: {first['msg'].removeprefix('Value error, ')}", err=True)
        raise typer.Exit(2) from None


@app.command("export")
def export_cmd(
    reward_model: Annotated[
        str | None, typer.Option(help="The round's reward model (stage dir or checkpoint): the default judge.")
    ] = None,
    out_dir: Annotated[str, typer.Option(help="Store, selection, export and report go here.")] = "runs/flywheel",
    judge: Annotated[
        str | None, typer.Option(help="The gates' judge as JSON (judging.judges.JudgeConfig), e.g. '{\"backend\": "
                                 "\"openai\", \"api_key_env\": \"OPENAI_API_KEY\"}' (the key's variable NAME).")
    ] = None,
    gates_recipe: Annotated[str | None, typer.Option(help="Take the judge from this gates recipe's judge: key.")] = None,
    events: Annotated[list[str] | None, typer.Option(help="Event file to ingest first (repeatable).")] = None,
    db: Annotated[str | None, typer.Option(help="Store URL (default <out-dir>/signals.duckdb), without a password.")
                  ] = None,
    db_password_env: Annotated[
        str | None, typer.Option(help="NAME of the environment variable holding the database password (default: "
                                 "PGPASSWORD or ~/.pgpass, read by PostgreSQL's driver).")
    ] = None,
    traffic_data: Annotated[str, typer.Option()] = "demo:traffic/alpaca_eval_clusters.csv",
    budget_fraction: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of turns to label.")] = 0.005,
    budget: Annotated[
        int | None, typer.Option(min=0, help="Turns to label (overrides --budget-fraction); never exceeded.")
    ] = None,
    floor: Annotated[
        int, typer.Option(min=0, help="Turns each intent with candidates gets first, as far as the budget holds.")
    ] = 1,
    k: Annotated[int, typer.Option(help="Responses per selected turn.")] = 2,
    alternatives: Annotated[str | None, typer.Option(help="alternatives.jsonl (simulator).")] = None,
    policy: Annotated[str | None, typer.Option(help="Sample missing responses from this policy.")] = None,
    expert_labels: Annotated[str | None, typer.Option(help="Expert verdicts per turn (quality table).")] = None,
) -> None:
    """Ingest -> judge -> select -> scrub -> export (Label Studio tasks), as the Prefect flow ``flywheel``."""
    from flows.flywheel import FlywheelParameters, flywheel

    params = _params(
        FlywheelParameters,
        out_dir=out_dir,
        db=db,
        db_password_env=db_password_env,
        events=events or [],
        reward_model_dir=reward_model,
        judge=judge,
        gates_recipe=gates_recipe,
        traffic_data=traffic_data,
        budget_fraction=budget_fraction,
        budget=budget,
        floor=floor,
        k=k,
        alternatives=alternatives,
        policy_dir=policy,
        expert_labels=expert_labels,
    )
    report = _run(flywheel, params)
    typer.echo(
        dumps_strict(
            {
                "selected": report["selection"]["n_selected"],
                "tasks": report["export"]["tasks"],
                "pii_counts": report["export"]["pii_counts"],
                "tasks_file": str(Path(out_dir) / "export" / "tasks.json"),
            },
            indent=2,
        )
    )


@app.command("annotate-sim")
def annotate_sim_cmd(
    export_dir: Annotated[str, typer.Option(help="The flywheel's export folder.")],
    alternatives: Annotated[str, typer.Option(help="alternatives.jsonl with the held verdicts (simulator).")],
    out: Annotated[str, typer.Option(help="Where the simulated Label Studio export goes.")],
    annotators: Annotated[int, typer.Option()] = 3,
    noise: Annotated[float, typer.Option(help="P(an annotator departs from the held verdict).")] = 0.2,
    p_unlabelled: Annotated[float, typer.Option()] = 0.05,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Simulated expert annotation from held labels, written in Label Studio's JSON export format (demo only)."""
    from flywheel.annotation import simulate_annotations
    from flywheel.simulate import held_truth
    from rlhf.manifest import atomic_write_text

    def run(_):
        tasks = json.loads((Path(export_dir) / "tasks.json").read_text())
        rows = simulate_annotations(
            tasks, held_truth(alternatives), n_annotators=annotators, noise=noise, p_unlabelled=p_unlabelled, seed=seed
        )
        atomic_write_text(Path(out), dumps_strict(rows, ensure_ascii=False))
        return rows

    rows = _run(run, None)
    typer.echo(dumps_strict({"tasks": len(rows), "labelled": sum(bool(r["annotations"]) for r in rows), "out": out}))


@app.command("import")
def import_cmd(
    export_dir: Annotated[str, typer.Option(help="The flywheel's export folder.")],
    labels: Annotated[str, typer.Option(help="Label Studio JSON export.")],
    out_dir: Annotated[str, typer.Option(help="Dataset versions go here.")] = "runs/flywheel/datasets",
    gate_generations: Annotated[str | None, typer.Option(help="Decontaminate against these gate prompts.")] = None,
    gates_recipe: Annotated[str | None, typer.Option(help="Decontaminate against a gate recipe's suites.")] = None,
    heldout_fraction: Annotated[float, typer.Option()] = 0.3,
) -> None:
    """Labels -> expert pairs -> decontamination -> dataset version (as the Prefect flow ``flywheel-import``)."""
    from flows.flywheel import ImportParameters, flywheel_import

    m = _run(
        flywheel_import,
        ImportParameters(
            export_dir=export_dir,
            labels=labels,
            out_dir=out_dir,
            gate_generations=gate_generations,
            gates_recipe=gates_recipe,
            heldout_fraction=heldout_fraction,
        ),
    )
    typer.echo(
        dumps_strict(
            {k: m[k] for k in ("dir", "n_pairs", "n_agreement_rows", "n_unlabelled_tasks", "n_unlabelled_annotations")}
            | {"decontaminated": m["decontamination"]["n_removed"]},
            indent=2,
        )
    )
