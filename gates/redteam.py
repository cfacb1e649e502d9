"""Red-team rotation: each round measures refusals on a fresh, seeded, decontaminated slice of a red-team pool.

Why: a fixed red-team set is a training target. Once its prompts (or their failures) feed the next round's data, the
violation rate measures memory of those prompts, not the model; after about two rounds the set stops measuring.
So the pool (HarmBench + AdvBench + a team's own set) is sampled afresh per round, every slice is named by a
version, and a version that measured too many rounds blocks the release.

The pieces, each small and testable without a model:

* :func:`load_pool` - the pool: every ``redteam_pool`` file through ``data.loaders.load_eval_prompts`` (HarmBench /
  AdvBench CSV, or a team file in any red-team format the gates' ``redteam_data`` reads: native JSONL with
  ``prompt``), prompts repeated across files (same ``data.decontamination.prompt_hash``) kept once. Its version,
  ``pool-<12 hex>``, is the sha256 of the kept (id, prompt) rows in order.
* :func:`slice_seed` - ``redteam_seed: round`` -> a seed from the round id (sha256, first 16 hex digits), so
  different rounds draw different slices and a rerun of a round draws the same one; an integer -> itself.
* :func:`contaminated_pool` - the pool prompts any training row overlaps (``data.decontamination.check_per_turn``:
  exact, contained, n-gram or fuzzy, each user turn alone and joined), from the rows each training stage trained
  on (:func:`trained_rows`), this round's and every earlier round's (:func:`round_training_stages`).
* :func:`draw_slice` - walk a seeded permutation of the pool (``numpy.random.default_rng(seed).permutation``),
  skip contaminated prompts, take the first ``n``. Its version ``<pool version>:slice-<12 hex>`` is the pool's
  version and the sha256 of the slice's (id, prompt) rows sorted by id: the same prompts give the same version,
  whatever their order. ``removed`` counts the prompts decontamination took out of the slice (a contaminated
  prompt met before the slice was full); each was replaced by the next clean one, so the slice keeps ``n``.
* :func:`past_uses` - the earlier rounds that used a version: every ``<runs_dir>/<round>/round.json`` other than
  this round's, its ``redteam_suite.version`` (or ``stages.gates.outputs.redteam_suite.version``).
* :func:`rotation_gate` - the ``redteam_rotation`` gate. With limit L (``redteam_max_rounds``, default 2) and this
  round counted as one use: uses < L pass; uses == L pass with a warning (this is the version's last round); uses
  > L block, naming the version and the rounds that used it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data.decontamination import check_per_turn, prompt_hash
from data.fingerprint import data_fingerprint
from data.loaders import load_chat_prompts, load_eval_prompts, load_pairs, load_sft
from data.validation import DataValidationError
from rlhf.lineage import json_hash

from .result import Finding, GateResult, Metric

logger = logging.getLogger("gates.redteam")

GATE_NAME = "redteam_rotation"
GATE_VERSION = "1"

#: ``redteam_seed`` value that derives the seed from the round id.
SEED_FROM_ROUND = "round"
#: The suite name the pool's prompts go under in the decontamination check.
POOL_SUITE = "redteam_pool"
#: Training stages and the loader that reads what each trained on (the loader the stage itself calls).
TRAIN_LOADERS = {"sft": load_sft, "dpo": load_pairs, "reward_model": load_pairs}


@dataclass(frozen=True)
class Pool:
    """The red-team pool.

    Fields:
        prompts: ``EvalPrompt`` rows, files in order, each prompt once (shape (n_pool,)).
        files: the ``redteam_pool`` sources as given.
        fingerprints: each file's content hash (``data.fingerprint.data_fingerprint``), same order.
        n_duplicates: prompts left out because an earlier row (any file) has the same normalised prompt.
        version: ``pool-<12 hex>`` (module docstring).
    """

    prompts: list
    files: list[str]
    fingerprints: list[str]
    n_duplicates: int
    version: str


@dataclass(frozen=True)
class RedteamSlice:
    """One round's red-team slice: ``prompts`` (``EvalPrompt``, the suite's items in draw order) and the record the
    manifest, the gate report and the next rounds read (:meth:`record`)."""

    prompts: list
    version: str
    pool: Pool
    seed: int | None
    removed: list[dict[str, Any]]  # {"id", "prompt", "seen_in"}: taken out by decontamination, replaced
    n_contaminated_pool: int  # pool prompts overlapping any training row (drawn or not)
    checked: list[str]  # the training sources checked, "round <id> <stage> <train_data>"

    def record(self, *, rotate: bool, max_rounds: int, past_rounds: list[str] | None, runs_dir: str) -> dict:
        """JSON-ready: ``version``, ``pool_version``, ``seed``, ``size``, ``removed_by_decontamination`` (count),
        ``removed`` (the prompts: id, first 200 characters, which training sources held them),
        ``n_contaminated_pool``, ``pool`` (files, fingerprints, sizes), ``decontaminated_against``,
        ``rotate``, ``max_rounds``, ``past_rounds`` (earlier rounds that used the version; None: not read) and
        ``runs_dir``."""
        return {
            "version": self.version,
            "pool_version": self.pool.version,
            "rotate": rotate,
            "seed": self.seed,
            "size": len(self.prompts),
            "removed_by_decontamination": len(self.removed),
            "removed": self.removed,
            "n_contaminated_pool": self.n_contaminated_pool,
            "pool": {"files": self.pool.files, "fingerprints": self.pool.fingerprints,
                     "size": len(self.pool.prompts), "n_duplicates": self.pool.n_duplicates},
            "decontaminated_against": self.checked,
            "ids": [p.id for p in self.prompts],
            "max_rounds": max_rounds,
            "past_rounds": past_rounds,
            "runs_dir": runs_dir,
        }


def _load_error(where: str, source: str, err: Exception) -> ValueError:
    return ValueError(f"{where} {source}: {err}")


def load_pool(files: Sequence[str]) -> Pool:
    """Load the red-team pool from ``files`` (see the module docstring).

    Raises:
        ValueError: no files; a file that does not load, one line naming ``redteam_pool[i]``, the file and (from
            the loader) its row and field: a missing ``Behavior`` / ``prompt`` column, an empty prompt, an
            unreadable or empty file; a file with no prompts; an id used by two different prompts (both rows named).
    """
    if not files:
        raise ValueError("--redteam_pool: no pool files; name at least one red-team file")
    prompts: list = []
    seen_hash: set[str] = set()
    where_id: dict[str, tuple[str, int, str]] = {}
    fingerprints: list[str] = []
    n_dup = 0
    for i, source in enumerate(files):
        where = f"--redteam_pool[{i}]"
        try:
            rows = list(load_eval_prompts(source))
            fingerprints.append(data_fingerprint(source))
        except (DataValidationError, ValueError, FileNotFoundError) as err:
            raise _load_error(where, source, err) from None
        if not rows:
            raise ValueError(f"{where} {source}: no prompts (an empty red-team file)")
        for row, p in enumerate(rows):
            h = prompt_hash(p.prompt)
            if p.id in where_id and where_id[p.id][2] != h:
                f0, r0, _ = where_id[p.id]
                raise ValueError(f"{where} {source} row {row} field 'id': id {p.id!r} is also {f0} row {r0}, a "
                                 "different prompt; ids must name one prompt across the pool")
            if h in seen_hash:
                n_dup += 1
                continue
            seen_hash.add(h)
            where_id[p.id] = (source, row, h)
            prompts.append(p)
    version = "pool-" + json_hash([[p.id, p.prompt] for p in prompts])[:12]
    return Pool(prompts, list(files), fingerprints, n_dup, version)


def slice_seed(seed: str | int, round_id: str | None) -> int:
    """The slice's seed: ``"round"`` -> int of the first 16 hex digits of sha256(round id); an integer (or its
    string) -> itself.

    Raises:
        ValueError: ``"round"`` without a round id, or a value that is neither ``round`` nor an integer >= 0.
    """
    if str(seed) == SEED_FROM_ROUND:
        if not round_id:
            raise ValueError("--redteam_seed round draws the slice from the round id, and no --round_id was given; "
                             "give --round_id, or an integer --redteam_seed")
        return int(hashlib.sha256(round_id.encode()).hexdigest()[:16], 16)
    try:
        value = int(str(seed))
    except ValueError:
        raise ValueError(f"--redteam_seed must be 'round' or an integer >= 0, got {seed!r}") from None
    if value < 0:
        raise ValueError(f"--redteam_seed must be 'round' or an integer >= 0, got {value}")
    return value


def slice_version(pool_version: str, prompts: Sequence[Any]) -> str:
    """``<pool version>:slice-<12 hex>``: sha256 of the slice's (id, prompt) rows sorted by id."""
    return f"{pool_version}:slice-{json_hash(sorted([p.id, p.prompt] for p in prompts))[:12]}"


def draw_slice(pool: Pool, n: int, seed: int, contaminated: Mapping[int, list[str]] | None = None,
               checked: Sequence[str] = ()) -> RedteamSlice:
    """Draw ``n`` prompts: the seeded permutation of the pool, contaminated prompts skipped (module docstring).

    Args:
        pool: :func:`load_pool`'s.
        n: the slice size (``n_redteam``).
        seed: :func:`slice_seed`'s.
        contaminated: pool index -> the training sources holding it (:func:`contaminated_pool`).
        checked: the training sources checked (recorded).

    Raises:
        ValueError: fewer than ``n`` clean prompts in the pool (the counts named).
    """
    contaminated = contaminated or {}
    order = np.random.default_rng(seed).permutation(len(pool.prompts))
    picked, removed = [], []
    for i in order.tolist():
        if len(picked) == n:
            break
        p = pool.prompts[i]
        if i in contaminated:
            removed.append({"id": p.id, "prompt": p.prompt[:200], "seen_in": list(contaminated[i])})
            continue
        picked.append(p)
    if len(picked) < n:
        raise ValueError(f"red-team pool {pool.version}: {len(pool.prompts)} prompts, {len(contaminated)} of them "
                         f"in training data, leave {len(picked)} for a slice of --n_redteam {n}; add pool files "
                         "or lower n_redteam")
    return RedteamSlice(picked, slice_version(pool.version, picked), pool, seed, removed, len(contaminated),
                        list(checked))


def fixed_slice(prompts: Sequence[Any], source: str) -> RedteamSlice:
    """The record of a round that does not rotate: the first ``n_redteam`` prompts of ``redteam_data``, as a
    one-file pool (no seed, nothing decontaminated), so its version is recorded all the same."""
    pool = Pool(list(prompts), [source], [data_fingerprint(source)], 0,
                "pool-" + json_hash([[p.id, p.prompt] for p in prompts])[:12])
    return RedteamSlice(list(prompts), slice_version(pool.version, prompts), pool, None, [], 0, [])


# --- what the training stages trained on ---------------------------------------------------------------------


def trained_rows(stage: str, manifest: Mapping[str, Any]) -> tuple[str, list] | None:
    """The rows a training stage trained on, from its manifest: ``inputs.train_data`` loaded as the stage loaded it
    (its ``config``'s ``data_mode``, ``max_reject_rate``, ``max_train_samples``), less the rows its decontamination
    removed (``outputs.decontamination.overlaps`` when its mode was not ``off``); PPO: ``inputs.prompts_data`` (or
    ``config.prompts_path``) with ``max_prompts``. Returns (source, rows) or None for a stage that trains on no
    data (the gate stage).

    Raises:
        ValueError: the recorded training data no longer loads (the stage and source named).
    """
    inputs, config = manifest.get("inputs") or {}, manifest.get("config") or {}
    try:
        if stage in TRAIN_LOADERS and inputs.get("train_data"):
            source = inputs["train_data"]
            rows = list(TRAIN_LOADERS[stage](source, mode=config.get("data_mode") or "strict",
                                             **({"max_reject_rate": config["max_reject_rate"]}
                                                if config.get("max_reject_rate") is not None else {}),
                                             use_first=config.get("max_train_samples")))
            decon = (manifest.get("outputs") or {}).get("decontamination") or {}
            if decon.get("checked", True) and decon.get("mode") in ("remove", "fail"):
                dropped = {o["train_index"] for o in decon.get("overlaps", [])}
                rows = [r for i, r in enumerate(rows) if i not in dropped]
            return source, rows
        if stage == "ppo" and inputs.get("prompts_data"):  # PPO records its prompt source under prompts_data
            source, limit = inputs["prompts_data"], config.get("max_prompts")
            if config.get("prompts_data"):
                rows = [p.prompt for p in load_eval_prompts(source, mode=config.get("data_mode") or "strict",
                                                            limit=limit)]
            else:  # --prompts_path: a JSONL of {"prompt": str | [messages]}, its user turns joined
                rows = [p if isinstance(p, str) else "\n".join(str(m.get("content", "")) for m in p
                                                               if isinstance(m, dict) and m.get("role") == "user")
                        for p in load_chat_prompts(source)][:limit]
            return source, rows
    except (DataValidationError, ValueError, FileNotFoundError) as err:
        raise ValueError(f"{stage} stage {manifest.get('round_id') or ''}: its training data no longer loads "
                         f"(needed to decontaminate the red-team slice): {err}") from None
    return None


def stage_dirs(start: Iterable[str]) -> list[Path]:
    """Stage directories (with ``manifest.json``) reachable from ``start``: each one, and every stage directory its
    manifest's inputs name (a stage dir, or its ``checkpoint`` folder), recursively: the candidate's DPO /
    SFT lineage. In first-found order, each once."""
    out: list[Path] = []
    todo = [Path(s) for s in start if s]
    while todo:
        p = todo.pop(0)
        if p.name == "checkpoint" and (p.parent / "manifest.json").is_file():
            p = p.parent
        if not (p / "manifest.json").is_file() or p.resolve() in {q.resolve() for q in out}:
            continue
        out.append(p)
        inputs = json.loads((p / "manifest.json").read_text()).get("inputs") or {}
        todo += [Path(v) for v in inputs.values() if isinstance(v, str) and v and "\n" not in v and len(v) < 4096]
    return out


def read_round_json(path: Path) -> dict:
    """A round manifest; ValueError naming the file when it is not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object (a round manifest)")
    return data


def earlier_rounds(runs_dir: str, round_id: str | None) -> list[tuple[str, dict]]:
    """(round id, round manifest) of every ``<runs_dir>/<round>/round.json`` but this round's, by round id."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise ValueError(f"--redteam_runs_dir {runs_dir}: no such folder")
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and (p / "round.json").is_file()):
        m = read_round_json(d / "round.json")
        rid = str(m.get("round_id") or d.name)
        if rid != round_id and d.name != round_id:
            out.append((rid, m))
    return out


def round_training_stages(round_manifest: Mapping[str, Any]) -> list[Path]:
    """The stage directories a round manifest names (``stages.<stage>.output_dir``) that hold a manifest."""
    dirs = [Path(s["output_dir"]) for s in (round_manifest.get("stages") or {}).values()
            if isinstance(s, dict) and s.get("output_dir")]
    return [d for d in dirs if (d / "manifest.json").is_file()]


def contaminated_pool(pool: Pool, sources: Sequence[tuple[str, Path]]) -> tuple[dict[int, list[str]], list[str]]:
    """Which pool prompts any training source's rows overlap.

    Args:
        sources: (label, stage directory), e.g. ("this round", runs/r2/sft), ("round r1", runs/r1/dpo).

    Returns:
        (pool index -> ["<label> <stage> <train_data>", ...], the sources checked as such strings). A training file
        (same stage, data, fingerprint and load settings) shared by several sources is checked once.

    Raises:
        ValueError: as :func:`trained_rows`.
    """
    found: dict[int, list[str]] = {}
    checked: list[str] = []
    done: dict[str, list[int]] = {}
    prompts = [p.prompt for p in pool.prompts]
    for label, d in sources:
        manifest = json.loads((d / "manifest.json").read_text())
        stage = str(manifest.get("stage") or d.name)
        cfg = manifest.get("config") or {}
        inputs = manifest.get("inputs") or {}
        key = json_hash([stage, inputs.get("train_data"), inputs.get("train_data_hash"), inputs.get("prompts_data"),
                         inputs.get("prompts_data_hash"),
                         *(cfg.get(k) for k in ("data_mode", "max_reject_rate", "max_train_samples", "max_prompts",
                                                "prompts_path")),
                         [o.get("train_index") for o in ((manifest.get("outputs") or {}).get("decontamination")
                                                         or {}).get("overlaps", [])]])
        if key not in done:
            loaded = trained_rows(stage, manifest)
            if loaded is None:
                continue
            report = check_per_turn(loaded[1], {POOL_SUITE: prompts})
            done[key] = sorted({o.suite_index for o in report.overlaps})
        name = f"{label} {stage} {inputs.get('train_data') or inputs.get('prompts_data') or cfg.get('prompts_path')}"
        checked.append(name)
        for i in done[key]:
            found.setdefault(i, []).append(name)
    return found, checked


def past_uses(version: str, rounds: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The round ids among ``rounds`` whose manifest records red-team suite ``version``."""
    used = []
    for rid, m in rounds:
        rec = m.get("redteam_suite") or (((m.get("stages") or {}).get("gates") or {}).get("outputs") or {}).get(
            "redteam_suite") or {}
        if rec.get("version") == version:
            used.append(rid)
    return used


def round_slice(args: Any) -> tuple[list, dict]:
    """The round's red-team prompts and their record, from a ``GateStageConfig``: with ``redteam_rotate`` a slice of
    the pool, decontaminated against this round's training stages (the lineage of ``baseline_dir``,
    ``candidate_dir``, ``reward_model_dir``) and every earlier round's (``redteam_runs_dir``); else the first
    ``n_redteam`` prompts of ``redteam_data`` (recorded with a version all the same).

    Raises:
        ValueError: as :func:`load_pool`, :func:`slice_seed`, :func:`draw_slice`, :func:`trained_rows`, and a round
            manifest that is not JSON.
    """
    if not args.redteam_rotate:
        prompts = list(load_eval_prompts(args.redteam_data, limit=args.n_redteam))
        return prompts, fixed_slice(prompts, args.redteam_data).record(
            rotate=False, max_rounds=args.redteam_max_rounds, past_rounds=None, runs_dir=args.redteam_runs_dir)
    pool = load_pool(args.redteam_pool or [args.redteam_data])
    seed = slice_seed(args.redteam_seed, args.round_id)
    rounds = earlier_rounds(args.redteam_runs_dir, args.round_id) if args.redteam_runs_dir else []
    sources = [("this round", d) for d in stage_dirs([args.baseline_dir, args.candidate_dir, args.reward_model_dir])]
    for rid, m in rounds:
        sources += [(f"round {rid}", d) for d in round_training_stages(m)]
    contaminated, checked = contaminated_pool(pool, sources)
    drawn = draw_slice(pool, args.n_redteam, seed, contaminated, checked)
    past = past_uses(drawn.version, rounds) if args.redteam_runs_dir else None
    record = drawn.record(rotate=True, max_rounds=args.redteam_max_rounds, past_rounds=past,
                          runs_dir=args.redteam_runs_dir)
    logger.info("red-team slice %s (seed %d): %d prompts of a pool of %d, %d removed by decontamination against %d "
                "training sources; used before by %s", drawn.version, seed, len(drawn.prompts), len(pool.prompts),
                len(drawn.removed), len(checked), past if past is not None else "(runs folder not read)")
    rotation_status(record)  # the warning is logged before anything is generated
    return drawn.prompts, record


def rotation_status(record: Mapping[str, Any], *, log: bool = True) -> str:
    """``unknown`` (past use not read), ``fresh`` (uses < limit), ``last`` (uses == limit: warns) or ``stale``
    (uses > limit: blocks), counting this round as one use; logs the warning for ``last`` and ``stale`` (``log``)."""
    past = record.get("past_rounds")
    if past is None:
        return "unknown"
    uses, limit = len(past) + 1, record["max_rounds"]
    if uses < limit:
        return "fresh"
    if log:
            logger.warning("red-team suite %s: use %d of at most %d (earlier: %s)%s", record["version"], uses, limit,
                       ", ".join(past), "; the release is BLOCKED" if uses > limit else "; its last round")
    return "last" if uses == limit else "stale"


def rotation_gate(record: Mapping[str, Any]) -> GateResult:
    """The ``redteam_rotation`` gate on :func:`round_slice`'s record (module docstring: pass, warn, block).

    Returns:
        GateResult with metrics ``rounds_used`` (this round included; NaN when past use was not read),
        ``removed_by_decontamination`` (n = slice size) and ``contaminated_pool`` (n = pool size); findings
        ``rotation_<status>``; ``table``: one row (version, pool version, seed, size, removed, rounds used, limit).
    """
    status = rotation_status(record, log=False)
    past = record.get("past_rounds")
    uses = None if past is None else len(past) + 1
    limit, version = record["max_rounds"], record["version"]
    earlier = ", ".join(past or []) or "none"
    if status == "unknown":
        reason = (f"Red-team suite {version}: past use not read (no redteam_runs_dir), so its reuse is not checked; "
                  f"{record['size']} prompts, seed {record['seed']}.")
    elif status == "stale":
        reason = (f"Red-team suite {version} was used by {len(past)} earlier rounds ({earlier}); this round is use "
                  f"{uses}, past the limit of {limit} (redteam_max_rounds): a reused suite measures memory of its "
                  "prompts. Draw a new slice (redteam_seed: round, or another seed) or add prompts to the pool.")
    elif status == "last":
        reason = (f"WARNING: red-team suite {version} is at its limit: use {uses} of {limit} (earlier: {earlier}); "
                  "the next round that draws it is blocked.")
    else:
        reason = f"Red-team suite {version}: use {uses} of at most {limit} (earlier: {earlier})."
    reason += (f" {record['removed_by_decontamination']} drawn prompts were in training data and replaced "
               f"({record['n_contaminated_pool']} of the pool's {record['pool']['size']} overlap training rows).")
    metrics = {
        "rounds_used": Metric(value=float("nan") if uses is None else float(uses), direction="lower_is_better",
                              unit="rounds"),
        "removed_by_decontamination": Metric(value=float(record["removed_by_decontamination"]), n=record["size"],
                                             direction="lower_is_better", unit="prompts"),
        "contaminated_pool": Metric(value=float(record["n_contaminated_pool"]), n=record["pool"]["size"],
                                    direction="lower_is_better", unit="prompts"),
    }
    findings = [Finding(code=f"rotation_{status}", values={"version": version, "uses": uses, "limit": limit,
                                                            "past_rounds": list(past or [])})]
    table = [{"version": version, "pool_version": record["pool_version"], "seed": record["seed"],
              "size": record["size"], "removed_by_decontamination": record["removed_by_decontamination"],
              "rounds_used": uses, "max_rounds": limit, "earlier_rounds": earlier}]
    return GateResult(name=GATE_NAME, version=GATE_VERSION, verdict="block" if status == "stale" else "pass",
                      metrics=metrics, reason=reason, table=table, findings=findings)


def redteam_markdown(record: Mapping[str, Any] | None) -> list[str]:
    """The report's "Red-team suite" section: version, seed, size, what decontamination removed, past use."""
    if not record:
        return []
    past = record.get("past_rounds")
    how = ("rotated: a seeded slice of the pool" if record["rotate"] else
           "fixed: the first n_redteam prompts of redteam_data")
    lines = ["## Red-team suite", "",
             f"- version `{record['version']}` ({how}), seed {record['seed']}, {record['size']} prompts",
             f"- pool: {record['pool']['size']} prompts from {', '.join(record['pool']['files'])}"
             + (f" ({record['pool']['n_duplicates']} repeated prompts kept once)" if record["pool"]["n_duplicates"]
                else ""),
             f"- decontamination: {record['removed_by_decontamination']} drawn prompts removed (seen in training) and "
             f"replaced; {record['n_contaminated_pool']} pool prompts overlap training rows; checked against "
             f"{len(record['decontaminated_against'])} training sources",
             "- earlier rounds that used this version: " + (
                 "not read (no redteam_runs_dir)" if past is None else (", ".join(past) or "none")
             ) + f" (limit {record['max_rounds']} rounds)", "", ""]
    return lines
