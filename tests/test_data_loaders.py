"""Loaders: sources, format detection, file/row/field errors, lenient mode, HF export."""

import gzip
import json

import pytest

from data import loaders
from data.loaders import (
    LoadedRows,
    SourceUnavailableError,
    load_eval_prompts,
    load_pairs,
    load_sft,
    open_source,
    to_hf_dataset,
)
from data.schemas import Conversation, EvalPrompt, PreferencePair
from data.validation import DataValidationError, RejectRateExceeded


def U(text="hi"):
    return {"role": "user", "content": text}


def A(text="hello"):
    return {"role": "assistant", "content": text}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD_CONV = {"messages": [U(), A()]}
GOOD_PAIR = {"prompt": [U()], "chosen": "yes", "rejected": "no"}
HH_ROW = {"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: bye"}


@pytest.fixture(autouse=True)
def _rejects_in_tmp(tmp_path, monkeypatch):
    """Lenient loads without rejects_path write to $RLHF_REJECTS_DIR: keep them out of the work tree."""
    monkeypatch.setenv("RLHF_REJECTS_DIR", str(tmp_path / "rejects"))


# -------------------------------------------------------- malformed rows: file, row, field, reason


@pytest.mark.parametrize(
    ("bad", "field", "reason"),
    [
        pytest.param({"messages": [U(), {"role": "assistant", "content": 3}]}, "messages[1].content", "valid string, got int", id="non-string content"),
        pytest.param({"messages": [U(), A("")]}, "messages[1].content", "empty assistant turn", id="empty assistant turn"),
        pytest.param({"messages": [U(), A(), U()]}, "messages[2].role", "ends on a user turn", id="ends on user turn"),
        pytest.param({"messages": [A(), U(), A()]}, "messages[0].role", "first turn is from the assistant", id="first turn assistant"),
        pytest.param({"messages": [U(), U(), A()]}, "messages[1].role", "two user turns in a row", id="two user turns"),
    ],
)
def test_sft_file_errors_name_file_row_field_reason(tmp_path, bad, field, reason):
    path = write_jsonl(tmp_path / "sft.jsonl", [GOOD_CONV, GOOD_CONV, bad])
    with pytest.raises(DataValidationError) as info:
        load_sft(path)
    err = info.value
    assert (err.file, err.row, err.field) == (str(path), 2, field)
    assert reason in err.reason
    assert str(err) == f"{path} row 2 field '{field}': {err.reason}"


def test_missing_chosen_in_hh_file(tmp_path):
    path = write_jsonl(tmp_path / "hh.jsonl", [HH_ROW, {"rejected": HH_ROW["rejected"]}])
    with pytest.raises(DataValidationError) as info:
        load_pairs(path)
    assert str(info.value) == f"{path} row 1 field 'chosen': missing (field required)"


def test_missing_chosen_in_native_file(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [GOOD_PAIR, {"prompt": [U()], "rejected": "no"}])
    with pytest.raises(DataValidationError) as info:
        load_pairs(path)
    assert (info.value.row, info.value.field, info.value.reason) == (1, "chosen", "missing (field required)")


def test_row_numbers_are_zero_based_line_indices(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(GOOD_CONV) + "\n\n" + "{not json\n")
    with pytest.raises(DataValidationError) as info:
        load_sft(path)
    assert info.value.row == 2 and info.value.reason.startswith("invalid JSON")  # line 3 of the file


# ----------------------------------------------------------------------------------- lenient


def test_lenient_load_accounts_for_every_row(tmp_path):
    rows = [GOOD_CONV] * 38 + [{"messages": [U(), A("")]}, {"messages": [U(), U(), A()]}]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    out = tmp_path / "rejects.jsonl"
    loaded = load_sft(path, mode="lenient", rejects_path=out)
    assert isinstance(loaded, LoadedRows) and len(loaded) == 38
    assert (loaded.n_read, len(loaded.rejects), loaded.rejects_path) == (40, 2, out)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["row"], r["field"]) for r in written] == [(38, "messages[1].content"), (39, "messages[1].role")]
    assert written[0]["raw"] == rows[38]
    assert [c.id for c in loaded[:2]] == ["sft-0", "sft-1"]


def test_lenient_load_above_threshold_raises_after_writing(tmp_path):
    path = write_jsonl(tmp_path / "sft.jsonl", [GOOD_CONV] * 9 + [{"messages": [U()]}])
    out = tmp_path / "r.jsonl"
    with pytest.raises(RejectRateExceeded) as info:
        load_sft(path, mode="lenient", rejects_path=out)
    assert (info.value.n_rejected, info.value.n_total) == (1, 10)
    assert len(out.read_text().splitlines()) == 1
    assert len(load_sft(path, mode="lenient", rejects_path=out, max_reject_rate=0.1)) == 9


def test_lenient_default_rejects_path(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_REJECTS_DIR", str(tmp_path / "rej"))
    path = write_jsonl(tmp_path / "mine.jsonl", [GOOD_PAIR, {**GOOD_PAIR, "chosen": "no"}])
    loaded = load_pairs(path, mode="lenient", max_reject_rate=0.5)
    assert loaded.rejects_path == tmp_path / "rej" / "mine.pairs.rejects.jsonl"
    assert "identical to chosen" in json.loads(loaded.rejects_path.read_text())["reason"]


def test_duplicate_ids_are_bad_rows(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{**GOOD_PAIR, "id": "a"}, {**GOOD_PAIR, "id": "a"}])
    with pytest.raises(DataValidationError) as info:
        load_pairs(path)
    assert (info.value.row, info.value.field) == (1, "id") and "duplicate id 'a'" in info.value.reason


def test_empty_source_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DataValidationError, match="no rows"):
        load_sft(path, mode="lenient")


# --------------------------------------------------------------------- sources and formats


def test_format_detection_and_file_types(tmp_path):
    hh = write_jsonl(tmp_path / "hh.jsonl", [HH_ROW])
    assert load_pairs(hh).source_format == "hh"
    assert load_sft(hh)[0].messages[-1].content == "hello"

    implicit = write_jsonl(tmp_path / "imp.jsonl", [{"chosen": [U(), A("a")], "rejected": [U(), A("b")]}])
    assert load_pairs(implicit).source_format == "implicit"

    gz = tmp_path / "pairs.jsonl.gz"
    gz.write_bytes(gzip.compress((json.dumps(GOOD_PAIR) + "\n").encode()))
    loaded = load_pairs(gz)
    assert loaded.source_format == "native" and loaded[0].id == "pairs-0"

    panda = tmp_path / "panda.json"
    panda.write_text(json.dumps([{"idx": 0, "instruction": "i", "input": "", "response1": "a", "response2": "b",
                                  "annotator1": 1, "annotator2": 2, "annotator3": 1, "motivation_app": "X"}]))
    assert load_pairs(panda)[0].id == "pandalm-0"

    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"data": [GOOD_CONV]}))
    assert len(load_sft(wrapped)) == 1

    pc = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "q", "completion": "a"}])
    assert load_sft(pc)[0].messages[0].role == "user"

    with pytest.raises(DataValidationError, match="cannot recognise a pairs format"):
        load_pairs(write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}]))
    with pytest.raises(ValueError, match="unknown pairs format"):
        load_pairs(hh, source_format="nope")


def test_csv_eval_prompts_and_set_name(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text('id,prompt,type,label,focus,note\n1,"How do I kill a process?",homonyms,safe,kill,\n2,"How do I kill a person?",contrast_homonyms,unsafe,kill,\n')
    rows = load_eval_prompts(path)
    assert [(p.id, p.set) for p in rows] == [("xstest-1", "xstest_safe"), ("xstest-2", "xstest_unsafe")]
    assert [p.id for p in load_eval_prompts(path, "xstest_unsafe")] == ["xstest-2"]
    assert [p.id for p in load_eval_prompts(path, "xstest_unsafe", limit=1)] == ["xstest-2"]  # limit counts the set's prompts
    assert [p.id for p in load_eval_prompts(path, limit=1)] == ["xstest-1"]
    with pytest.raises(ValueError, match="sets in this source"):
        load_eval_prompts(path, "harmbench")
    plain = write_jsonl(tmp_path / "mine.jsonl", [{"prompt": "a"}, {"prompt": "b", "set": "other"}])
    assert [p.set for p in load_eval_prompts(plain)] == ["mine", "other"]
    assert [p.set for p in load_eval_prompts(plain, "custom")] == ["custom", "other"]


def test_in_memory_and_limit():
    rows = load_pairs([GOOD_PAIR, {**GOOD_PAIR, "chosen": "maybe"}, {**GOOD_PAIR, "chosen": "x"}], limit=2)
    assert [p.id for p in rows] == ["memory-0", "memory-1"] and rows.n_read == 2


def test_missing_local_file_and_demo_name(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_sft(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="hh_sft"):
        load_sft("demo:does_not_exist")


def test_hf_dataset_unreachable(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'Anthropic/hh-rlhf' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SourceUnavailableError, match="Anthropic/hh-rlhf.*hub is unreachable"):
        load_pairs("Anthropic/hh-rlhf")


def test_hf_dataset_rows_are_loaded(monkeypatch):
    import datasets

    calls = {}

    def fake(name, split, **kwargs):
        calls.update(name=name, split=split, **kwargs)
        return datasets.Dataset.from_list([HH_ROW])

    monkeypatch.setattr(datasets, "load_dataset", fake)
    rows = load_pairs("hf:Anthropic/hh-rlhf", split="test", hf_kwargs={"data_dir": "harmless-base"})
    assert calls == {"name": "Anthropic/hh-rlhf", "split": "test", "data_dir": "harmless-base"}
    assert rows.source == "hf:Anthropic/hh-rlhf[test]" and rows[0].id == "Anthropic_hh-rlhf-0"


def test_open_source_labels_demo_files():
    raw = open_source("demo:xstest", limit=3)
    assert raw.label == "demo:xstest/xstest_prompts.csv" and raw.stem == "xstest_prompts" and len(raw.records) == 3


# --------------------------------------------------------------------------------- HF export


def test_to_hf_dataset_trl_formats():
    conv = Conversation(id="c", messages=[U(), A()])
    pair = PreferencePair(id="p", prompt=[U()], chosen="a", rejected="b")
    prompt = EvalPrompt(id="e", prompt="q", set="s")
    ds = to_hf_dataset([conv])
    assert ds.column_names == ["id", "messages"] and ds[0]["messages"] == [U(), A()]
    ds = to_hf_dataset([pair], include_id=False)
    assert ds.column_names == ["prompt", "chosen", "rejected"]
    assert ds[0]["chosen"] == [{"role": "assistant", "content": "a"}]
    assert to_hf_dataset([prompt])[0]["prompt"] == [{"role": "user", "content": "q"}]
    with pytest.raises(TypeError):
        to_hf_dataset([conv, pair])
    with pytest.raises(ValueError):
        to_hf_dataset([])


def test_module_exports():
    for name in ("load_sft", "load_pairs", "load_eval_prompts", "to_hf_dataset", "load_alpaca_eval", "load_judge_labels"):
        assert name in loaders.__all__


# ---------------------------------------------------------------------------------------------
# an absolute path to a local dataset folder (once refused with "data file not found")
# ---------------------------------------------------------------------------------------------


def test_absolute_path_to_a_local_dataset_folder_is_read_like_a_hub_folder(tmp_path):
    import shutil

    from data.bundle import demo_path

    folder = tmp_path / "my_pairs"
    (folder / "data").mkdir(parents=True)
    shutil.copy(demo_path("demo:hh_rlhf/pairs_train.jsonl"), folder / "data" / "train-00000-of-00001.jsonl")
    shutil.copy(demo_path("demo:hh_rlhf/pairs_heldout.jsonl"), folder / "data" / "test-00000-of-00001.jsonl")
    (folder / "README.md").write_text("# my pairs\n")
    expected = loaders.load_pairs("demo:hh_rlhf/pairs_train.jsonl")
    got = loaders.load_pairs(str(folder.resolve()))  # absolute: the path that once gave "data file not found"
    assert len(got) == len(expected) == 300
    assert [p.chosen for p in got] == [p.chosen for p in expected]
    assert len(loaders.load_pairs(str(folder), split="test")) == 99
    # a folder without split names is all "train", its files read in sorted order, rows numbered across them
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(demo_path("demo:hh_rlhf/pairs_train.jsonl"), flat / "a.jsonl")
    shutil.copy(demo_path("demo:hh_rlhf/pairs_heldout.jsonl"), flat / "b.jsonl")
    src = loaders.open_source(str(flat))
    assert len(src.records) == 399 and src.records[300][0] == 300 and "a.jsonl, b.jsonl" in src.label


def test_a_folder_without_data_files_names_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("not data")
    with pytest.raises(FileNotFoundError, match=r"no data file for split 'train' .*\.jsonl.*notes\.txt"):
        loaders.load_pairs(str(tmp_path))
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no data file for split 'validation' .*validation"):
        loaders.open_source(str(tmp_path), split="validation")


def test_a_row_over_the_size_limit_is_a_bad_row_named_by_its_line(tmp_path, monkeypatch):
    """A JSONL row longer than MAX_ROW_BYTES (lowered to 1 KiB here) is refused at its row in strict mode and is one
    reject in lenient mode, the others kept; only a 200-character prefix reaches the rejects file."""
    monkeypatch.setattr(loaders, "MAX_ROW_BYTES", 1024)
    huge = {"messages": [U("x" * 5000), A()]}
    path = write_jsonl(tmp_path / "sft.jsonl", [GOOD_CONV, huge, GOOD_CONV])
    with pytest.raises(DataValidationError, match=r"row 1.*over the 1,024-byte limit"):
        load_sft(path)
    out = tmp_path / "rejects.jsonl"
    loaded = load_sft(path, mode="lenient", rejects_path=out, max_reject_rate=0.5)
    assert len(loaded) == 2 and (loaded.n_read, len(loaded.rejects)) == (3, 1)
    written = json.loads(out.read_text())
    assert written["row"] == 1 and "bytes, over the 1,024-byte limit" in written["reason"]
    assert len(json.dumps(written)) < 1024
