"""Annotation round trip through Label Studio's formats.

Export: each selected turn becomes C(k, 2) pairwise tasks (its k responses compared two by two), in Label Studio's
task import format (a JSON list of ``{"data": {...}}``) with a pairwise-comparison labelling config
(:data:`LABEL_CONFIG`: the conversation as ``Text``, the two responses as ``Text``, a ``Pairwise`` control over them
and a ``Tie`` choice). Every text is scrubbed of personal data first (:mod:`flywheel.scrub`); the per-entity counts
go into the export manifest.

Import: Label Studio's JSON export (a list of tasks, each with ``data`` as exported and ``annotations``, each
annotation with ``completed_by`` and a ``result`` list; a ``pairwise`` result's ``value.selected`` is ``"left"``
or ``"right"``, a ``choices`` result on ``tie`` with ``["Tie"]`` is a tie) becomes :class:`data.expert.ExpertPair`
objects (several annotators per task, their ids kept), and then a new dataset version: ``pairs.jsonl`` (the next
round's preference pairs: majority verdicts, ties and splits left out), ``agreement.jsonl`` (multi-annotator
``labels`` rows of held-out tasks, the format the reward model's unlock rule reads) and ``manifest.json`` with the lineage (hashes
of the selection, the export and the labels file). A malformed export is a clear error naming task, annotation and
field; a task nobody labelled (no annotation, or only cancelled ones) is listed in the manifest, never dropped
silently.

Formats as documented by Label Studio (task format and export format guides, ``Pairwise`` tag). The tests run
against those documented shapes and, in ``tests/test_flywheel_label_studio.py``, through a real Label Studio
server's API (project with :data:`LABEL_CONFIG`, task import, several annotator accounts, JSON export). The server's
default export leaves tasks without annotations out; they are reported as ``"not in the export"`` (export with
``download_all_tasks=true`` to have them as ``"no annotation"``).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from data.expert import ExpertLabel, ExpertPair, write_agreement_data, write_training_pairs
from rlhf.lineage import file_hash, json_hash
from rlhf.manifest import atomic_write_text

__all__ = [
    "LABEL_CONFIG",
    "AnnotationImportError",
    "EmptyDatasetError",
    "LabelImport",
    "build_tasks",
    "decontaminate_pairs",
    "read_label_studio_export",
    "read_label_studio_labels",
    "simulate_annotations",
    "turn_key",
    "write_dataset_version",
    "write_export",
]

LABEL_CONFIG = """<View>
  <Header value="Which reply is better for the conversation? (Tie if neither is)"/>
  <Text name="prompt" value="$prompt"/>
  <View style="display: flex; gap: 1em;">
    <View style="flex: 50%"><Header value="Reply A"/><Text name="response_a" value="$response_a"/></View>
    <View style="flex: 50%"><Header value="Reply B"/><Text name="response_b" value="$response_b"/></View>
  </View>
  <Pairwise name="preference" toName="response_a,response_b" leftClass="response_a" rightClass="response_b"/>
  <Choices name="tie" toName="prompt" choice="single" required="false">
    <Choice value="Tie"/>
  </Choices>
</View>
"""


class AnnotationImportError(ValueError):
    """A malformed Label Studio export: names the file, task (0-based index), annotation and field."""

    def __init__(
        self,
        reason: str,
        *,
        file: str,
        task: int | None = None,
        annotation: int | None = None,
        field: str | None = None,
    ):
        where = [file] + [f"task {task}"] * (task is not None) + [f"annotation {annotation}"] * (annotation is not None)
        where += [f"field '{field}'"] * (field is not None)
        super().__init__(f"{' '.join(where)}: {reason}")
        self.file, self.task, self.annotation, self.field, self.reason = file, task, annotation, field, reason
        self.ls_task_id = None

    def with_ls_task_id(self, ls_task_id: Any) -> AnnotationImportError:
        """Add Label Studio's own task ``id`` (what its UI shows) to the message; returns ``self``."""
        if ls_task_id is not None and self.ls_task_id is None:
            self.ls_task_id = ls_task_id
            note = f"(Label Studio task id {ls_task_id}; 'task N' is the 0-based position in the file)"
            self.args = (f"{self.args[0]} {note}",)
        return self

    def __str__(self) -> str:
        return str(self.args[0])


class EmptyDatasetError(ValueError):
    """A dataset version would hold no labelled task (or no training pair): refused, nothing written."""


def _render(messages: list[dict]) -> str:
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


@dataclass
class Export:
    """Tasks plus what the export manifest records."""

    tasks: list[dict]
    pii_counts: Counter = field(default_factory=Counter)
    skipped: list[dict] = field(default_factory=list)
    #: what the scrub looked for and what not (``flywheel.scrub.Scrubber.manifest()``); None: not recorded
    scrub: dict | None = None


def turn_key(turn: dict) -> str:
    """12 hex digits naming one turn response (user, conversation, turn, reply) without showing the user id:
    two users' turns under one conversation id, or two replies of one turn, get different task keys."""
    from rlhf.lineage import json_hash

    return json_hash([turn["user_id"], turn["conversation_id"], int(turn["turn_id"]), turn["response_hash"]])[:12]


def build_tasks(
    selected: Sequence[dict],
    history: Callable[[dict], list[dict]],
    responses: Callable[[dict], list[str]],
    *,
    k: int = 2,
    scrub: Callable[[str], tuple[str, Counter]],
) -> Export:
    """Pairwise tasks for the selected turns.

    Args:
        selected: selected turns (dicts with ``user_id``, ``conversation_id``, ``turn_id``, ``response_hash``,
            ``intent``, ``kind``, ``disagreement``).
        history: ``turn -> [{"turn_id", "prompt", "response"}, ...]``: the conversation as that user saw it up to
            and including this turn (:meth:`flywheel.store.SignalStore.history`); ``[]`` when not stored. The
            task shows exactly these messages (the user id itself never leaves).
        responses: ``turn -> [response, ...]``: the turn's candidate responses, its own first (stored
            alternatives, gate generations or samples from the current policy); the first ``k`` are used.
        k: responses per turn (>= 2); C(k, 2) tasks per turn.
        scrub: ``text -> (scrubbed text, entity counts)``; applied to every text that leaves, before responses are
            deduplicated (two replies that differ only in personal data are one reply once scrubbed).

    Returns:
        :class:`Export`; turns with fewer than 2 distinct scrubbed responses are listed in ``skipped`` with the
        reason.
    """
    if k < 2:
        raise ValueError(f"k must be >= 2 (two responses per comparison), got {k}")
    out = Export(tasks=[])
    for turn in selected:
        conv, t = turn["conversation_id"], int(turn["turn_id"])
        key = turn_key(turn)
        seen = history(turn)
        if not seen or seen[-1]["turn_id"] != t:
            out.skipped.append({"conversation_id": conv, "turn_id": t, "turn_key": key, "reason": "turn not in the store"})
            continue
        messages = []
        for x in seen:
            messages.append({"role": "user", "content": x["prompt"]})
            if x["turn_id"] < t:
                messages.append({"role": "assistant", "content": x["response"]})
        # scrub first, deduplicate after: replies that differ only in personal data collapse into one here, not
        # in two identical-looking tasks whose labels could not be told apart
        scrubbed: dict[str, Counter] = {}
        for r in responses(turn):
            if not r or not r.strip():
                continue
            text, counts = scrub(r)
            if text not in scrubbed:
                scrubbed[text] = counts
            if len(scrubbed) == k:
                break
        if len(scrubbed) < 2:
            out.skipped.append(
                {"conversation_id": conv, "turn_id": t, "turn_key": key,
                 "reason": f"{len(scrubbed)} distinct response(s) after the scrub"}
            )
            continue
        clean_msgs = []
        for m in messages:
            text, counts = scrub(m["content"])
            out.pii_counts.update(counts)
            clean_msgs.append({"role": m["role"], "content": text})
        clean = list(scrubbed)
        for counts in scrubbed.values():
            out.pii_counts.update(counts)
        for i, j in itertools.combinations(range(len(clean)), 2):
            out.tasks.append(
                {
                    "data": {
                        "task_key": f"{conv}:{t}:{key}:{i}-{j}",
                        "conversation_id": conv,
                        "turn_id": t,
                        "turn_key": key,
                        "response_index_a": i,
                        "response_index_b": j,
                        "intent": turn.get("intent"),
                        "kind": turn.get("kind"),
                        "disagreement": None if turn.get("disagreement") is None else float(turn["disagreement"]),
                        "messages": clean_msgs,
                        "prompt": _render(clean_msgs),
                        "response_a": clean[i],
                        "response_b": clean[j],
                    }
                }
            )
    return out


def write_export(export: Export, out_dir: str | Path, *, selection_hash: str) -> dict:
    """Write ``tasks.json`` (Label Studio import), ``label_config.xml`` and ``export.json`` (manifest).

    Returns:
        the export manifest: ``tasks``, ``turns``, ``skipped``, ``pii_counts``, ``selection_hash``,
        ``export_hash`` (sha256 of tasks.json), ``label_config_hash``, and ``scrub`` (classes looked for, classes
        not looked for, recognizers, NER model) when the export carries it.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "tasks.json", json.dumps(export.tasks, ensure_ascii=False, indent=1))
    atomic_write_text(out / "label_config.xml", LABEL_CONFIG)
    manifest = {
        "tasks": len(export.tasks),
        "turns": len({t["data"]["turn_key"] for t in export.tasks}),
        "skipped": export.skipped,
        "pii_counts": dict(sorted(export.pii_counts.items())),
        "selection_hash": selection_hash,
        "export_hash": file_hash(out / "tasks.json"),
        "label_config_hash": file_hash(out / "label_config.xml"),
    }
    if export.scrub is not None:
        manifest["scrub"] = export.scrub
    atomic_write_text(out / "export.json", json.dumps(manifest, indent=2))
    return manifest


def _annotator(value: Any, *, file: str, task: int, ann: int) -> str:
    """``completed_by`` as ``"ls-user-<id>"``, keyed on the Label Studio user id in every form an export gives it:
    an integer (``7``), a numeric string (``"7"``), or a user object with ``id`` (``{"id": 7, "email": ...}``). The
    e-mail or name of a user object is never read (nothing personal is kept), so one user is one annotator.

    Raises:
        AnnotationImportError: no annotator, or a form without a user id (a user object without ``id``, a string
            that is not a number: e.g. an e-mail, which the message does not repeat).
    """
    def bad(reason: str) -> AnnotationImportError:
        return AnnotationImportError(reason, file=file, task=task, annotation=ann, field="completed_by")

    if isinstance(value, bool) or value is None:
        raise bad("missing annotator (completed_by)")
    if isinstance(value, dict):
        if "id" not in value:
            raise bad("user object without 'id': the Label Studio user id is needed (e-mails are not used)")
        value = value["id"]
        if isinstance(value, bool) or value is None:
            raise bad("user object with an empty 'id'")
    if isinstance(value, int) and value >= 0:
        return f"ls-user-{value}"
    if isinstance(value, str) and value.strip().isdigit():
        return f"ls-user-{int(value.strip())}"
    raise bad(
        f"not a Label Studio user id (a {type(value).__name__}; expected an integer, a numeric string or an object "
        "with 'id'; the value is not repeated here, it may be personal)"
    )


def _verdict(result: Any, *, file: str, task: int, ann: int) -> int | None:
    """0 tie, 1 A, 2 B from one annotation's ``result`` list; None when it holds no verdict."""
    if not isinstance(result, list):
        raise AnnotationImportError("result must be a list", file=file, task=task, annotation=ann, field="result")
    verdict = None
    for r, item in enumerate(result):
        if not isinstance(item, dict) or not isinstance(item.get("value"), dict):
            raise AnnotationImportError(
                "result item without a value object", file=file, task=task, annotation=ann, field=f"result[{r}].value"
            )
        kind, value = item.get("type"), item["value"]
        if kind == "pairwise":
            sel = value.get("selected")
            if sel not in ("left", "right"):
                raise AnnotationImportError(
                    f"pairwise selected must be 'left' or 'right', got {sel!r}",
                    file=file,
                    task=task,
                    annotation=ann,
                    field=f"result[{r}].value.selected",
                )
            if verdict is None:
                verdict = 1 if sel == "left" else 2
        elif kind == "choices" and item.get("from_name") == "tie":
            if value.get("choices") == ["Tie"]:
                verdict = 0  # a tie overrides a side
            elif value.get("choices"):
                raise AnnotationImportError(
                    f"unknown tie choice {value.get('choices')!r}",
                    file=file,
                    task=task,
                    annotation=ann,
                    field=f"result[{r}].value.choices",
                )
    return verdict


@dataclass
class LabelImport:
    """What :func:`read_label_studio_labels` read.

    Attributes:
        pairs: one :class:`ExpertPair` per task with at least one verdict.
        unlabelled: ``[{"task_key", "reason"}]`` for exported tasks without any verdict.
        unlabelled_annotations: ``[{"task_key", "ls_task_id", "annotation_id", "annotator", "reason"}]`` for each
            annotation that is neither cancelled nor a verdict (``result: []``, or results without a pairwise or
            tie choice): counted and listed, never dropped silently.
        repeated_annotations: the same as above for an annotator's second annotation of a task with the SAME
            verdict (kept once).
    """

    pairs: list[ExpertPair]
    unlabelled: list[dict]
    unlabelled_annotations: list[dict] = field(default_factory=list)
    repeated_annotations: list[dict] = field(default_factory=list)


def read_label_studio_export(path: str | Path, tasks: Sequence[dict]) -> tuple[list[ExpertPair], list[dict]]:
    """``(pairs, unlabelled)`` of :func:`read_label_studio_labels` (same checks and errors)."""
    got = read_label_studio_labels(path, tasks)
    return got.pairs, got.unlabelled


def read_label_studio_labels(path: str | Path, tasks: Sequence[dict]) -> LabelImport:
    """Expert pairs from a Label Studio JSON export of the exported ``tasks``.

    Conflicts are errors, never merged silently:
        - an export with no task at all (``[]``: a wrong file, or an export taken before anyone labelled);
        - the same task twice (the same Label Studio ``id``, or the same ``data.task_key`` under two ids);
        - the same annotator with two different verdicts on one task. Label Studio keeps one annotation per
          annotator and task, updated in place when they change their mind (``updated_at``), so two annotations
          are an import of merged exports or a second pass: which one counts is the project's decision, not
          this reader's. Two annotations with the same verdict are kept once and listed in
          ``repeated_annotations``.

    Returns:
        :class:`LabelImport`. One label per annotator per task; a task without any verdict is in ``unlabelled``
        (missing from the export, no annotation, only cancelled or empty annotations); every non-cancelled
        annotation without a verdict is in ``unlabelled_annotations``.

    Raises:
        AnnotationImportError: not JSON, not a list, an empty list, a task without ``data.task_key`` or with a key
            that was never exported, a duplicated task, an annotation without annotator, a result that is not a
            pairwise / tie verdict, or one annotator's conflicting verdicts. Messages name the 0-based task
            position and Label Studio's own task ``id``.
    """
    path = Path(path)
    file = str(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise AnnotationImportError(f"cannot read: {err}", file=file) from None
    except json.JSONDecodeError as err:
        raise AnnotationImportError(f"not valid JSON ({err.msg} at line {err.lineno})", file=file) from None
    if not isinstance(raw, list):
        raise AnnotationImportError(f"expected a JSON list of tasks, got {type(raw).__name__}", file=file)
    if not raw:
        raise AnnotationImportError(
            "the export holds no task (an empty list): a wrong file, or exported before anyone labelled; "
            "nothing imported",
            file=file,
        )
    by_key = {t["data"]["task_key"]: t["data"] for t in tasks}
    seen: dict[str, dict[str, int]] = {}
    reasons: dict[str, str] = {}
    ids: dict[Any, int] = {}
    key_at: dict[str, int] = {}
    empty: list[dict] = []
    repeated: list[dict] = []
    for i, task in enumerate(raw):
        ls_id = task.get("id") if isinstance(task, dict) else None
        try:
            _read_task(task, i, ls_id, file, by_key, ids, key_at, seen, reasons, empty, repeated)
        except AnnotationImportError as err:
            raise err.with_ls_task_id(ls_id) from None
    pairs, unlabelled = [], []
    for key, data in by_key.items():
        labels = seen.get(key)
        if not labels:
            unlabelled.append({"task_key": key, "reason": reasons.get(key, "not in the export")})
            continue
        pairs.append(
            ExpertPair(
                id=key,
                prompt=data["messages"],
                response_a=data["response_a"],
                response_b=data["response_b"],
                labels=[ExpertLabel(annotator_id=w, verdict=v, task_id=key) for w, v in sorted(labels.items())],
                intent=data.get("intent"),
            )
        )
    return LabelImport(pairs, unlabelled, empty, repeated)


def _read_task(task, i, ls_id, file, by_key, ids, key_at, seen, reasons, empty, repeated) -> None:
    """One exported task into ``seen[key][annotator] = verdict`` (see :func:`read_label_studio_labels`)."""
    if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
        raise AnnotationImportError("task without a data object", file=file, task=i, field="data")
    if ls_id is not None:
        if ls_id in ids:
            raise AnnotationImportError(
                f"duplicated task: Label Studio id {ls_id!r} already appeared as task {ids[ls_id]}; "
                "labels of one task are never merged from two copies",
                file=file,
                task=i,
                field="id",
            )
        ids[ls_id] = i
    key = task["data"].get("task_key")
    if key not in by_key:
        raise AnnotationImportError(
            f"task_key {key!r} is not one of the exported tasks", file=file, task=i, field="data.task_key"
        )
    if key in key_at:
        raise AnnotationImportError(
            f"duplicated task: task_key {key!r} already appeared as task {key_at[key]}",
            file=file,
            task=i,
            field="data.task_key",
        )
    key_at[key] = i
    anns = task.get("annotations", [])
    if not isinstance(anns, list):
        raise AnnotationImportError("annotations must be a list", file=file, task=i, field="annotations")
    labels = seen.setdefault(key, {})
    first: dict[str, int] = {}
    for a, ann in enumerate(anns):
        if not isinstance(ann, dict):
            raise AnnotationImportError("annotation is not an object", file=file, task=i, annotation=a)
        if ann.get("was_cancelled"):
            continue
        who = _annotator(ann.get("completed_by"), file=file, task=i, ann=a)
        verdict = _verdict(ann.get("result"), file=file, task=i, ann=a)
        where = {"task_key": key, "ls_task_id": ls_id, "annotation_id": ann.get("id"), "annotator": who}
        if verdict is None:
            empty.append({**where, "reason": "empty result" if not ann.get("result") else "no pairwise or tie verdict"})
            continue
        if who in labels:
            if labels[who] != verdict:
                raise AnnotationImportError(
                    f"annotator {who!r} labelled this task twice with different verdicts (annotation {first[who]}: "
                    f"{_VERDICT_NAMES[labels[who]]}, annotation {a}: {_VERDICT_NAMES[verdict]}); keep one of them "
                    "in Label Studio and export again",
                    file=file,
                    task=i,
                    annotation=a,
                    field="completed_by",
                )
            repeated.append({**where, "reason": f"same verdict as annotation {first[who]}, kept once"})
            continue
        labels[who] = verdict
        first[who] = a
    if not labels:
        reasons[key] = "no annotation" if not anns else "only cancelled or empty annotations"


_VERDICT_NAMES = {0: "tie", 1: "A (left)", 2: "B (right)"}


def _held_out(task_id: str, fraction: float) -> bool:
    """Deterministic split on the task id's hash: the same task is held out in every rerun."""
    return int(json_hash(task_id)[:8], 16) / 0xFFFFFFFF < fraction


def decontaminate_pairs(pairs: Sequence[ExpertPair], suites: dict[str, Sequence[str]]) -> tuple[list[ExpertPair], dict]:
    """Imported pairs through the same decontamination as all training data (:mod:`data.decontamination`:
    normalised prompt equal or contained, word 8-gram overlap, fuzzy word similarity) against every gate suite, each user turn of a pair's prompt
    also checked alone (``per_turn=True``: a suite prompt asked as one turn of a longer conversation is found).
    Overlapping pairs are removed.

    Args:
        pairs: imported expert pairs.
        suites: ``{suite name: prompts}`` (every gate suite of the round).

    Returns:
        ``(kept, report)``; report: ``{"method", "n_in", "n_removed", "n_kept", "per_suite": {suite: pairs
        removed that overlap it}, "removed": [pair ids], "record": data.decontamination's manifest record}``.
    """
    from data.decontamination import decontaminate

    kept, record = decontaminate(list(pairs), suites, mode="remove", per_turn=True, label="flywheel import")
    per_suite = {name: len({o["train_index"] for o in record["overlaps"] if o["suite"] == name}) for name in suites}
    removed_idx = sorted({o["train_index"] for o in record["overlaps"]})
    report = {
        "method": f"data.decontamination (normalised prompt: exact or contained; word {record['n']}-gram overlap; "
                  f"word similarity >= {record['fuzzy_threshold']}; per user turn)",
        "n_in": len(pairs),
        "n_removed": len(removed_idx),
        "n_kept": len(kept),
        "per_suite": per_suite,
        "removed": [pairs[i].id for i in removed_idx],
        "record": record,
    }
    return kept, report


def write_dataset_version(
    pairs: Sequence[ExpertPair],
    unlabelled: Sequence[dict],
    out_root: str | Path,
    *,
    lineage: dict[str, str],
    decontamination: dict | None = None,
    heldout_fraction: float = 0.3,
    unlabelled_annotations: Sequence[dict] = (),
    repeated_annotations: Sequence[dict] = (),
    require_pairs: bool = False,
) -> dict:
    """A new dataset version ``<out_root>/v-<hash12>/`` named by the hash of its lineage (and the split).

    The labelled tasks are split by a hash of their id: ``heldout_fraction`` of them become the multi-annotator
    agreement data (``agreement.jsonl``; only tasks with the most common number of annotators, >= 2, so the
    label matrix is rectangular), the rest the training pairs (``pairs.jsonl``; majority verdicts, ties and splits
    left out). The reward model is never measured on pairs it trained on. ``manifest.json`` records the lineage,
    the counts, the unlabelled tasks and annotations, annotations repeated with the same verdict, and the
    decontamination report. Returns the manifest (with ``dir``, ``pairs``, ``agreement`` paths).

    Raises:
        EmptyDatasetError: no labelled task at all, or (``require_pairs``, as ``flywheel import`` asks) no
            training pair; checked before anything is written, so no version directory appears.
    """
    stamped = [p.model_copy(update={"lineage": dict(lineage)}) for p in pairs]
    held = [p for p in stamped if _held_out(p.id, heldout_fraction)]
    train = [p for p in stamped if not _held_out(p.id, heldout_fraction)]
    if not stamped:
        raise EmptyDatasetError(
            f"no labelled task ({len(unlabelled)} unlabelled, {len(unlabelled_annotations)} annotations without a "
            "verdict): no dataset version written"
        )
    if require_pairs and not any(p.to_preference_pair() is not None for p in train):
        raise EmptyDatasetError(
            f"0 training pairs: {len(train)} training task(s) all without a majority or tied, {len(held)} held out "
            f"(heldout_fraction={heldout_fraction}): no dataset version written"
        )
    version = json_hash({**lineage, "heldout_fraction": heldout_fraction})[:12]
    out = Path(out_root) / f"v-{version}"
    out.mkdir(parents=True, exist_ok=True)
    counts = Counter(len(p.labels) for p in held if len(p.labels) >= 2)
    n_ann = max(counts, key=lambda n: (counts[n], n)) if counts else 2
    pairs_path, n_pairs, n_no_majority = write_training_pairs(train, out / "pairs.jsonl")
    agree_path, n_agree = write_agreement_data(held, out / "agreement.jsonl", n_annotators=n_ann)
    annotators = Counter(lab.annotator_id for p in stamped for lab in p.labels)
    manifest = {
        "version": version,
        "dir": str(out),
        "lineage": dict(lineage),
        "pairs": str(pairs_path),
        "agreement": str(agree_path),
        "pairs_hash": file_hash(pairs_path),
        "agreement_hash": file_hash(agree_path),
        "n_labelled_tasks": len(stamped),
        "n_train_tasks": len(train),
        "n_heldout_tasks": len(held),
        "n_pairs": n_pairs,
        "n_no_majority_or_tie": n_no_majority,
        "n_agreement_rows": n_agree,
        "agreement_annotators_per_row": n_ann,
        "n_unlabelled_tasks": len(unlabelled),
        "unlabelled_tasks": list(unlabelled),
        "n_unlabelled_annotations": len(unlabelled_annotations),
        "unlabelled_annotations": list(unlabelled_annotations),
        "n_repeated_annotations": len(repeated_annotations),
        "repeated_annotations": list(repeated_annotations),
        "annotators": dict(sorted(annotators.items())),
        "decontamination": decontamination or {},
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2))
    return manifest


def simulate_annotations(
    tasks: Sequence[dict],
    truth: Callable[[dict], int | None],
    *,
    n_annotators: int = 3,
    noise: float = 0.2,
    p_unlabelled: float = 0.05,
    seed: int = 0,
    start_user_id: int = 101,
) -> list[dict]:
    """A Label Studio JSON export as expert annotators would produce it, for the demo and tests.

    Each task's true verdict comes from ``truth(task_data)`` (0 tie, 1 A, 2 B; ``None``: no held label, the
    annotators then pick a side at random). Each annotator gives the true verdict with probability ``1 - noise``
    and one of the other two otherwise (inter-annotator noise); a task is left unlabelled with ``p_unlabelled``.
    Annotators are Label Studio user ids ``start_user_id ...``.
    """
    rng = np.random.default_rng(seed)
    out = []
    for n, task in enumerate(tasks):
        anns = []
        if rng.random() >= p_unlabelled:
            true = truth(task["data"])
            for a in range(n_annotators):
                v = int(rng.integers(1, 3)) if true is None else true
                if rng.random() < noise:
                    v = int(rng.choice([x for x in (0, 1, 2) if x != v]))
                result = (
                    [{"from_name": "tie", "to_name": "prompt", "type": "choices", "value": {"choices": ["Tie"]}}]
                    if v == 0
                    else [
                        {
                            "from_name": "preference",
                            "to_name": "preference",
                            "type": "pairwise",
                            "value": {"selected": "left" if v == 1 else "right"},
                        }
                    ]
                )
                anns.append(
                    {
                        "id": n * 10 + a,
                        "completed_by": start_user_id + a,
                        "result": result,
                        "was_cancelled": False,
                        "ground_truth": False,
                        "task": n + 1,
                        "lead_time": 12.5,
                    }
                )
        out.append({"id": n + 1, "data": task["data"], "annotations": anns, "predictions": []})
    return out
