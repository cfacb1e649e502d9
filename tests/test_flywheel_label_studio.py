"""The annotation round trip through a real Label Studio server (PyPI ``label-studio``, started on loopback by
tests/label_studio_server.py): our labelling config is accepted by the server, our task file is imported through
its API, several annotator accounts label the tasks, and the server's own JSON export becomes expert pairs and a
dataset version. Skipped, with the reason printed, only where the server is not installed or does not start."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from flywheel.annotation import (
    LABEL_CONFIG,
    build_tasks,
    read_label_studio_export,
    simulate_annotations,
    turn_key,
    write_dataset_version,
    write_export,
)

CONVERSATIONS = {
    "c1": [{"turn_id": 0, "prompt": "How do I boil an egg?", "response": "Nine minutes."}],
    "c2": [
        {"turn_id": 0, "prompt": "Hi!", "response": "Hello."},
        {"turn_id": 1, "prompt": "Name a prime number.", "response": "Seven."},
    ],
}
ALTERNATIVES = {
    ("c1", 0): ["Nine minutes.", "Boil it for nine minutes, then cool it in cold water.", "No idea."],
    ("c2", 1): ["Seven.", "Seven is prime: its only divisors are 1 and 7."],
}
SELECTED = [
    {"user_id": "u1", "conversation_id": "c1", "turn_id": 0, "response_hash": "r-c1-0",
     "intent": "koala", "kind": "thumbs_up_judged_poor", "disagreement": 0.8},
    {"user_id": "u1", "conversation_id": "c2", "turn_id": 1, "response_hash": "r-c2-1",
     "intent": "oasst", "kind": "thumbs_down_judged_good", "disagreement": 0.9},
]
#: each selected turn's key in task keys (12 hex digits of user, conversation, turn, reply)
TK = {(t["conversation_id"], t["turn_id"]): turn_key(t) for t in SELECTED}


@pytest.fixture(scope="module")
def label_studio():
    from tests.label_studio_server import LabelStudioUnavailable, start_label_studio

    try:
        with start_label_studio() as server:
            yield server
    except LabelStudioUnavailable as err:
        print(f"Label Studio test skipped: {err}")
        pytest.skip(f"Label Studio server cannot be started: {err}")


def test_round_trip_through_the_label_studio_api(label_studio, tmp_path):
    url, token = label_studio
    export = build_tasks(
        SELECTED,
        lambda t: [x for x in CONVERSATIONS[t["conversation_id"]] if x["turn_id"] <= t["turn_id"]],
        lambda t: ALTERNATIVES[(t["conversation_id"], t["turn_id"])],
        k=3,
        scrub=lambda s: (s, Counter()),
    )
    manifest = write_export(export, tmp_path / "export", selection_hash="s" * 64)
    tasks = json.loads((tmp_path / "export" / "tasks.json").read_text())
    k1, k2 = (turn_key(t) for t in SELECTED)
    assert [t["data"]["task_key"] for t in tasks] == [f"c1:0:{k1}:0-1", f"c1:0:{k1}:0-2", f"c1:0:{k1}:1-2",
                                                      f"c2:1:{k2}:0-1"]

    with httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"}, timeout=60) as api:
        r = api.post("/api/projects", json={"title": "flywheel round trip", "label_config": LABEL_CONFIG})
        assert r.status_code == 201, r.text  # the server validates our pairwise labelling config
        project = r.json()["id"]
        r = api.post(f"/api/projects/{project}/import", json=tasks)
        assert r.status_code == 201 and r.json()["task_count"] == 4, r.text
        users = []
        for n in range(3):
            r = api.post("/api/users/", json={"email": f"annotator{n}@example.com", "username": f"annotator{n}"})
            assert r.status_code == 201, r.text
            users.append(r.json()["id"])
        listed = api.get("/api/tasks", params={"project": project, "page_size": 100}).json()["tasks"]
        by_key = {t["data"]["task_key"]: t["id"] for t in listed}
        # Truth: the longer reply is better (B when its index is the longer one); annotator 2 calls one a tie.
        longer = lambda d: 2 if len(d["response_b"]) > len(d["response_a"]) else 1
        sim = simulate_annotations(tasks, longer, n_annotators=3, noise=0.0, p_unlabelled=0.0)
        sim[0]["annotations"][2]["result"] = [
            {"from_name": "tie", "to_name": "prompt", "type": "choices", "value": {"choices": ["Tie"]}}
        ]
        for task, labelled in zip(tasks, sim):
            key = task["data"]["task_key"]
            if key == f"c2:1:{TK['c2', 1]}:0-1":
                continue  # nobody labels this one: it must be reported, not dropped
            for user, ann in zip(users, labelled["annotations"]):
                r = api.post(f"/api/tasks/{by_key[key]}/annotations", json={"result": ann["result"], "completed_by": user})
                assert r.status_code == 201, r.text
        r = api.get(f"/api/projects/{project}/export", params={"exportType": "JSON"})
        assert r.status_code == 200, r.text
        (tmp_path / "ls_export_default.json").write_text(r.text)
        r = api.get(f"/api/projects/{project}/export", params={"exportType": "JSON", "download_all_tasks": "true"})
        assert r.status_code == 200, r.text
        (tmp_path / "ls_export.json").write_text(r.text)

    # The server's default export leaves tasks without annotations out: reported as such, never dropped silently.
    pairs_default, unlabelled = read_label_studio_export(tmp_path / "ls_export_default.json", tasks)
    assert unlabelled == [{"task_key": f"c2:1:{TK['c2', 1]}:0-1", "reason": "not in the export"}]
    pairs, unlabelled = read_label_studio_export(tmp_path / "ls_export.json", tasks)  # download_all_tasks
    assert unlabelled == [{"task_key": f"c2:1:{TK['c2', 1]}:0-1", "reason": "no annotation"}]
    assert [p.id for p in pairs_default] == [p.id for p in pairs]
    ann = [f"ls-user-{u}" for u in users]
    # c1 responses: 0 "Nine minutes." (13 chars), 1 the long answer, 2 "No idea." (8 chars)
    assert [(p.id, [(lab.annotator_id, lab.verdict) for lab in p.labels]) for p in pairs] == [
        (f"c1:0:{TK['c1', 0]}:0-1", [(ann[0], 2), (ann[1], 2), (ann[2], 0)]),
        (f"c1:0:{TK['c1', 0]}:0-2", [(ann[0], 1), (ann[1], 1), (ann[2], 1)]),
        (f"c1:0:{TK['c1', 0]}:1-2", [(ann[0], 1), (ann[1], 1), (ann[2], 1)]),
    ]
    lineage = {"selection": "s" * 64, "export": manifest["export_hash"], "labels": "l" * 64}
    m = write_dataset_version(pairs, unlabelled, tmp_path / "datasets", lineage=lineage, heldout_fraction=0.0)
    assert (m["n_pairs"], m["n_unlabelled_tasks"]) == (3, 1)
