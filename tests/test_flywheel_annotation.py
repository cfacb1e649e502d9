"""Annotation round trip in Label Studio's documented formats, PII scrub, decontamination, dataset version."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from data.loaders import load_pairs
from flywheel.annotation import (
    LABEL_CONFIG,
    AnnotationImportError,
    EmptyDatasetError,
    build_tasks,
    decontaminate_pairs,
    read_label_studio_export,
    read_label_studio_labels,
    simulate_annotations,
    turn_key,
    write_dataset_version,
    write_export,
)
from flywheel.scrub import Scrubber

PLANTED = {
    "EMAIL_ADDRESS": "jane.doe@example.com",
    "PHONE_NUMBER": "+1 415 555 0123",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "IBAN_CODE": "GB82 WEST 1234 5698 7654 32",
    "IP_ADDRESS": "192.168.10.24",
    "STREET_ADDRESS": "221 Baker Street",
    "PERSON": "Jane Doe",
}
CONVERSATIONS = {
    "c1": [
        {
            "turn_id": 0,
            "prompt": f"Hi, my name is {PLANTED['PERSON']}. Mail me at {PLANTED['EMAIL_ADDRESS']}.",
            "response": "Hello! How can I help?",
        },
        {
            "turn_id": 1,
            "prompt": f"Call {PLANTED['PHONE_NUMBER']} or wire to {PLANTED['IBAN_CODE']}; my card is "
            f"{PLANTED['CREDIT_CARD']}. Server {PLANTED['IP_ADDRESS']}, I live at "
            f"{PLANTED['STREET_ADDRESS']}, London. Can you check my bill?",
            "response": "I cannot access bills.",
        },
    ],
    "c2": [{"turn_id": 0, "prompt": "How do I boil an egg?", "response": "Nine minutes."}],
    "c3": [{"turn_id": 0, "prompt": "Name a prime.", "response": "Seven."}],
}
ALTERNATIVES = {
    ("c1", 1): ["I cannot access bills.", "Sure, I can explain the charges on a typical bill.", "No."],
    ("c2", 0): ["Nine minutes.", "Boil it for nine minutes, then cool it in cold water."],
    ("c3", 0): ["Seven."],  # one response only: cannot be compared, reported as skipped
}
SELECTED = [
    {"user_id": "u1", "conversation_id": "c1", "turn_id": 1, "response_hash": "r-c1-1",
     "intent": "oasst", "kind": "thumbs_down_judged_good", "disagreement": 0.9},
    {"user_id": "u1", "conversation_id": "c2", "turn_id": 0, "response_hash": "r-c2-0",
     "intent": "koala", "kind": "thumbs_up_judged_poor", "disagreement": 0.8},
    {"user_id": "u1", "conversation_id": "c3", "turn_id": 0, "response_hash": "r-c3-0",
     "intent": "koala", "kind": "thumbs_up_judged_poor", "disagreement": 0.7},
]
#: each selected turn's key in task keys (12 hex digits of user, conversation, turn, reply)
TK = {(t["conversation_id"], t["turn_id"]): turn_key(t) for t in SELECTED}


@pytest.fixture(scope="module")
def scrubber():
    return Scrubber()


@pytest.fixture
def exported(scrubber, tmp_path):
    export = build_tasks(
        SELECTED,
        lambda t: [x for x in CONVERSATIONS[t["conversation_id"]] if x["turn_id"] <= t["turn_id"]],
        lambda t: ALTERNATIVES[(t["conversation_id"], t["turn_id"])],
        k=3,
        scrub=scrubber.scrub,
    )
    manifest = write_export(export, tmp_path / "export", selection_hash="s" * 64)
    return export, manifest, tmp_path


def test_no_planted_personal_data_leaves_in_the_export(exported):
    _, manifest, tmp = exported
    text = (tmp / "export" / "tasks.json").read_text()
    for entity, value in PLANTED.items():
        assert value not in text, entity
        assert f"<{entity}>" in text, entity
    assert "Jane" not in text and "jane" not in text
    # Turn 0 (name + email) is context of the selected turn 1: scrubbed once per turn; 3 responses have none.
    assert manifest["pii_counts"] == {
        "CREDIT_CARD": 1,
        "EMAIL_ADDRESS": 1,
        "IBAN_CODE": 1,
        "IP_ADDRESS": 1,
        "PERSON": 1,
        "PHONE_NUMBER": 1,
        "STREET_ADDRESS": 1,
    }


def test_label_studio_task_format_and_config(exported):
    _, manifest, tmp = exported
    tasks = json.loads((tmp / "export" / "tasks.json").read_text())
    # k=3 for c1 -> C(3,2) = 3 tasks; c2 has 2 responses -> 1 task; c3 skipped (1 response), reported.
    k1, k2, k3 = (turn_key(t) for t in SELECTED)  # 12 hex digits of (user, conversation, turn, reply)
    assert [t["data"]["task_key"] for t in tasks] == [f"c1:1:{k1}:0-1", f"c1:1:{k1}:0-2", f"c1:1:{k1}:1-2",
                                                      f"c2:0:{k2}:0-1"]
    assert "u1" not in json.dumps(tasks)  # the user id never reaches annotators
    assert manifest["skipped"] == [
        {"conversation_id": "c3", "turn_id": 0, "turn_key": k3, "reason": "1 distinct response(s) after the scrub"}
    ]
    assert (manifest["tasks"], manifest["turns"]) == (4, 2)
    assert tasks[0]["data"]["messages"][0]["role"] == "user" and tasks[0]["data"]["messages"][-1]["role"] == "user"
    assert len(tasks[0]["data"]["messages"]) == 3  # user, assistant, user (the selected turn's prompt)
    root = ET.fromstring(LABEL_CONFIG)  # well-formed; every $variable is a key of the task data
    pairwise = root.find(".//Pairwise")
    assert pairwise.get("toName") == "response_a,response_b"
    for el in root.iter():
        if (el.get("value") or "").startswith("$"):
            assert el.get("value")[1:] in tasks[0]["data"]


def _export_file(tmp, rows):
    path = tmp / "ls_export.json"
    path.write_text(json.dumps(rows))
    return path


def test_import_several_annotators_into_pairs_and_agreement_with_lineage(exported):
    export, manifest, tmp = exported
    tasks = export.tasks
    ls = simulate_annotations(
        tasks, truth=lambda d: 2 if d["response_index_a"] == 0 else 1, n_annotators=3, noise=0.0, p_unlabelled=0.0
    )
    ls[1]["annotations"] = []  # nobody labelled task 1
    ls[2]["annotations"][0]["was_cancelled"] = True  # one annotator skipped task 2
    ls[3]["annotations"][2]["result"] = [
        {"from_name": "tie", "to_name": "prompt", "type": "choices", "value": {"choices": ["Tie"]}}
    ]
    path = _export_file(tmp, ls)
    pairs, unlabelled = read_label_studio_export(path, tasks)
    assert unlabelled == [{"task_key": f"c1:1:{TK['c1', 1]}:0-2", "reason": "no annotation"}]
    assert [p.id for p in pairs] == [f"c1:1:{TK['c1', 1]}:0-1", f"c1:1:{TK['c1', 1]}:1-2", f"c2:0:{TK['c2', 0]}:0-1"]
    assert [[(lab.annotator_id, lab.verdict) for lab in p.labels] for p in pairs] == [
        [("ls-user-101", 2), ("ls-user-102", 2), ("ls-user-103", 2)],
        [("ls-user-102", 1), ("ls-user-103", 1)],
        [("ls-user-101", 2), ("ls-user-102", 2), ("ls-user-103", 0)],
    ]
    lineage = {"selection": "s" * 64, "export": manifest["export_hash"], "labels": "l" * 64}
    m = write_dataset_version(pairs, unlabelled, tmp / "datasets", lineage=lineage, heldout_fraction=0.0)
    assert (m["n_pairs"], m["n_agreement_rows"], m["n_unlabelled_tasks"]) == (3, 0, 1)
    train = load_pairs(m["pairs"])  # what the DPO and reward-model stages read
    assert train[0].chosen == "Sure, I can explain the charges on a typical bill."  # B won 3-0
    assert train[0].meta["lineage"] == lineage
    # All held out: agreement rows are the tasks with the modal annotator count (3), no training pairs.
    m = write_dataset_version(pairs, unlabelled, tmp / "datasets2", lineage=lineage, heldout_fraction=1.0)
    assert (m["n_pairs"], m["n_agreement_rows"], m["agreement_annotators_per_row"]) == (0, 2, 3)
    agree = load_pairs(m["agreement"])
    assert [lab.preference for lab in agree[1].labels] == [2, 2, 0]
    # The split is by task-id hash: training and agreement never share a task (0.2 holds out 2 of these 3 tasks,
    # whose id hashes read as 0.067, 0.103 and 0.255).
    m = write_dataset_version(pairs, unlabelled, tmp / "datasets3", lineage=lineage, heldout_fraction=0.2)
    ids_train = {p.id for p in load_pairs(m["pairs"])}
    ids_agree = {p.id for p in load_pairs(m["agreement"])} if m["n_agreement_rows"] else set()
    assert not ids_train & ids_agree and m["n_train_tasks"] + m["n_heldout_tasks"] == 3
    assert (m["n_train_tasks"], m["n_heldout_tasks"]) == (1, 2)
    again = write_dataset_version(pairs, unlabelled, tmp / "datasets3", lineage=lineage, heldout_fraction=0.2)
    assert again["version"] == m["version"] and again["pairs_hash"] == m["pairs_hash"]  # reproducible


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda ls: {"tasks": ls}, "expected a JSON list"),
        (lambda ls: [{**ls[0], "data": {"task_key": "nope"}}], "task 0 field 'data.task_key'"),
        (
            lambda ls: [{**ls[0], "annotations": [{**ls[0]["annotations"][0], "completed_by": None}]}],
            "task 0 annotation 0 field 'completed_by'",
        ),
        (
            lambda ls: [
                {
                    **ls[0],
                    "annotations": [
                        {
                            **ls[0]["annotations"][0],
                            "result": [
                                {"type": "pairwise", "from_name": "preference", "value": {"selected": "middle"}}
                            ],
                        }
                    ],
                }
            ],
            "task 0 annotation 0 field 'result[0].value.selected'",
        ),
    ],
)
def test_malformed_labels_file_is_a_clear_error(exported, mutate, where):
    export, _, tmp = exported
    ls = simulate_annotations(export.tasks, truth=lambda d: 1, noise=0.0, p_unlabelled=0.0)
    with pytest.raises(AnnotationImportError, match=where.replace("[", r"\[").replace("]", r"\]")):
        read_label_studio_export(_export_file(tmp, mutate(ls)), export.tasks)
    (tmp / "broken.json").write_text("[{")
    with pytest.raises(AnnotationImportError, match="not valid JSON"):
        read_label_studio_export(tmp / "broken.json", export.tasks)


def test_decontamination_removes_pairs_seen_in_a_gate_suite(exported):
    export, _, tmp = exported
    ls = simulate_annotations(export.tasks, truth=lambda d: 1, noise=0.0, p_unlabelled=0.0)
    pairs, _ = read_label_studio_export(_export_file(tmp, ls), export.tasks)
    # the shared rule (data.decontamination): same text up to case and spacing, or a shared word 8-gram
    kept, report = decontaminate_pairs(pairs, {"winrate": ["how do I  boil an EGG?"], "safe": ["Unrelated prompt"]})
    assert [p.id for p in kept] == [f"c1:1:{TK['c1', 1]}:0-1", f"c1:1:{TK['c1', 1]}:0-2", f"c1:1:{TK['c1', 1]}:1-2"]
    assert (report["n_in"], report["n_removed"], report["per_suite"]) == (4, 1, {"winrate": 1, "safe": 0})
    assert report["removed"] == [f"c2:0:{TK['c2', 0]}:0-1"]


# ---- an empty export is refused; conflicting labels are errors or listed, never merged -----------------------------
def _labels(export, **kw):
    return simulate_annotations(export.tasks, truth=lambda d: 1, noise=0.0, p_unlabelled=0.0, **kw)


def test_empty_export_is_refused_and_no_version_is_written(exported):
    export, manifest, tmp = exported
    with pytest.raises(AnnotationImportError, match=r"ls_export.json: the export holds no task \(an empty list\)"):
        read_label_studio_export(_export_file(tmp, []), export.tasks)
    # every task unlabelled: nothing labelled, so no version directory either
    ls = _labels(export)
    for t in ls:
        t["annotations"] = []
    pairs, unlabelled = read_label_studio_export(_export_file(tmp, ls), export.tasks)
    assert pairs == [] and len(unlabelled) == len(export.tasks) == 4
    lineage = {"selection": "s" * 64, "export": manifest["export_hash"], "labels": "l" * 64}
    with pytest.raises(EmptyDatasetError, match=r"no labelled task \(4 unlabelled"):
        write_dataset_version(pairs, unlabelled, tmp / "datasets", lineage=lineage)
    assert not (tmp / "datasets").exists()
    # labelled, but every task held out: 0 training pairs, refused where the flow asks for pairs
    ls = _labels(export)
    pairs, unlabelled = read_label_studio_export(_export_file(tmp, ls), export.tasks)
    with pytest.raises(EmptyDatasetError, match="0 training pairs"):
        write_dataset_version(pairs, unlabelled, tmp / "d2", lineage=lineage, heldout_fraction=1.0, require_pairs=True)
    assert not (tmp / "d2").exists()


def test_same_annotator_twice_with_different_verdicts_is_an_error(exported):
    export, _, tmp = exported
    ls = _labels(export)
    second = json.loads(json.dumps(ls[2]["annotations"][0]))  # ls-user-101 again, now choosing the right reply
    second["id"], second["result"][0]["value"]["selected"] = 999, "right"
    ls[2]["annotations"].append(second)
    with pytest.raises(AnnotationImportError) as err:
        read_label_studio_export(_export_file(tmp, ls), export.tasks)
    msg = str(err.value)
    assert msg.startswith(f"{tmp / 'ls_export.json'} task 2 annotation 3 field 'completed_by': annotator 'ls-user-101'")
    assert "annotation 0: A (left), annotation 3: B (right)" in msg
    assert msg.endswith("(Label Studio task id 3; 'task N' is the 0-based position in the file)")
    # the same verdict twice: kept once, and listed
    second["result"][0]["value"]["selected"] = "left"
    got = read_label_studio_labels(_export_file(tmp, ls), export.tasks)
    task2 = next(p for p in got.pairs if p.id == export.tasks[2]["data"]["task_key"])
    assert [lab.annotator_id for lab in task2.labels] == ["ls-user-101", "ls-user-102", "ls-user-103"]
    assert got.repeated_annotations == [
        {
            "task_key": export.tasks[2]["data"]["task_key"],
            "ls_task_id": 3,
            "annotation_id": 999,
            "annotator": "ls-user-101",
            "reason": "same verdict as annotation 0, kept once",
        }
    ]


@pytest.mark.parametrize("same", ["id", "task_key"])
def test_duplicated_task_is_an_error_naming_it(exported, same):
    export, _, tmp = exported
    ls = _labels(export)
    dup = json.loads(json.dumps(ls[1]))
    if same == "task_key":
        dup["id"] = 77
    ls.append(dup)
    with pytest.raises(AnnotationImportError) as err:
        read_label_studio_export(_export_file(tmp, ls), export.tasks)
    key = export.tasks[1]["data"]["task_key"]
    expected = (
        "duplicated task: Label Studio id 2 already appeared as task 1"
        if same == "id"
        else f"duplicated task: task_key {key!r} already appeared as task 1"
    )
    assert f"task 4 field '{'id' if same == 'id' else 'data.task_key'}': {expected}" in str(err.value)


def test_empty_result_is_counted_and_listed_in_the_manifest(exported):
    export, manifest, tmp = exported
    ls = _labels(export)
    ls[0]["annotations"][1]["result"] = []  # ls-user-102 submitted nothing on task 0
    for a in ls[3]["annotations"]:
        a["result"] = []  # nobody gave a verdict on task 3
    got = read_label_studio_labels(_export_file(tmp, ls), export.tasks)
    k0, k3 = (export.tasks[i]["data"]["task_key"] for i in (0, 3))
    assert [(u["task_key"], u["ls_task_id"], u["annotator"], u["reason"]) for u in got.unlabelled_annotations] == [
        (k0, 1, "ls-user-102", "empty result"),
        (k3, 4, "ls-user-101", "empty result"),
        (k3, 4, "ls-user-102", "empty result"),
        (k3, 4, "ls-user-103", "empty result"),
    ]
    assert got.unlabelled == [{"task_key": k3, "reason": "only cancelled or empty annotations"}]
    assert [len(p.labels) for p in got.pairs] == [2, 3, 3]
    lineage = {"selection": "s" * 64, "export": manifest["export_hash"], "labels": "l" * 64}
    m = write_dataset_version(
        got.pairs,
        got.unlabelled,
        tmp / "datasets",
        lineage=lineage,
        heldout_fraction=0.0,
        unlabelled_annotations=got.unlabelled_annotations,
    )
    saved = json.loads((tmp / "datasets" / f"v-{m['version']}" / "manifest.json").read_text())
    assert (saved["n_unlabelled_annotations"], saved["n_unlabelled_tasks"], saved["n_pairs"]) == (4, 1, 3)
    assert saved["unlabelled_annotations"][0]["annotator"] == "ls-user-102"
