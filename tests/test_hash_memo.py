"""The memo of large files' digests (rlhf.lineage.HashMemo): an unchanged file is not read again, a changed one
always is, and the memo can only save time, never change a digest."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
import types

import pytest

from rlhf import lineage
from rlhf.checkpoint import freeze_dir
from rlhf.lineage import HashMemo, content_hash, file_hash, remembered_hashes

SIZE = 4096  # above the test's MEMO_MIN_BYTES


@pytest.fixture
def reads(monkeypatch):
    """The files read to hash them (paths), with a threshold the test's small files pass."""
    monkeypatch.setattr(HashMemo, "MEMO_MIN_BYTES", 1024)
    seen: list[str] = []
    real = lineage._read_hash

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(lineage, "_read_hash", counting)
    return seen


def old_file(path, data: bytes, age_s: float = 60.0):
    """``data`` written to ``path`` with an mtime ``age_s`` in the past (a file not written in this clock tick)."""
    path.write_bytes(data)
    past = time.time() - age_s
    os.utime(path, (past, past))
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_read_once_and_digests_match_a_plain_read(tmp_path, reads):
    f = old_file(tmp_path / "w.bin", b"a" * SIZE)
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo):
        assert file_hash(f) == sha(b"a" * SIZE)
        assert file_hash(f) == sha(b"a" * SIZE)
    assert reads == ["w.bin"]
    with remembered_hashes(memo):  # a later process: the same file, from the database
        assert content_hash(tmp_path / "w.bin") == sha(b"a" * SIZE)
    assert reads == ["w.bin"]
    assert file_hash(f) == sha(b"a" * SIZE)  # outside the block every byte is read
    assert reads == ["w.bin", "w.bin"]


@pytest.mark.parametrize("change", ["rewritten, mtime restored", "replaced by rename"])
def test_new_bytes_under_the_same_name_size_and_mtime_are_read_again(tmp_path, reads, change):
    """``cp -p`` / ``touch -d`` over the file (the ctime the restore sets tells the memo), or a new file with the
    same size and mtime renamed over it (a new inode)."""
    f = old_file(tmp_path / "w.bin", b"a" * SIZE)
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo):
        file_hash(f)
    st = f.stat()
    time.sleep(0.02)  # past a coarse clock tick, so a new ctime differs
    if change == "rewritten, mtime restored":
        f.write_bytes(b"b" * SIZE)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        other = old_file(tmp_path / "other.bin", b"b" * SIZE)
        os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(other, f)
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    with remembered_hashes(memo):
        assert file_hash(f) == sha(b"b" * SIZE)
    assert reads == ["w.bin", "w.bin"]


def test_a_file_written_in_this_clock_tick_is_read_after_it(tmp_path, reads, monkeypatch):
    """git's racy-clean rule: a write in the same tick as the one read could leave the stat unchanged, so a file
    is read only once its last write lies RACY_NS back; one on a file system with whole-second stamps (whose tick
    would be a second) is not remembered."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * SIZE)
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo):
        assert file_hash(f) == sha(b"a" * SIZE)
        read = time.time_ns()
        file_hash(f)
    assert read - f.stat().st_mtime_ns >= HashMemo.RACY_NS
    assert reads == ["w.bin"]
    whole_second = tmp_path / "s.bin"
    whole_second.write_bytes(b"s" * SIZE)
    real_stat = os.stat

    def second_stamps(path, *args, **kwargs):  # a file system that stamps whole seconds
        st = real_stat(path, *args, **kwargs)
        if os.fsdecode(path).endswith("s.bin"):
            now = time.time_ns() // 10**9 * 10**9
            return types.SimpleNamespace(st_dev=st.st_dev, st_ino=st.st_ino, st_size=st.st_size, st_mtime_ns=now,
                                         st_ctime_ns=now)
        return st

    monkeypatch.setattr(lineage.os, "stat", second_stamps)
    with remembered_hashes(memo):
        file_hash(whole_second)
        file_hash(whole_second)
    monkeypatch.undo()
    assert reads == ["w.bin", "s.bin", "s.bin"]


def test_reuse_false_reads_every_byte_and_records_for_later(tmp_path, reads):
    f = old_file(tmp_path / "w.bin", b"a" * SIZE)
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo, reuse=False):
        file_hash(f)
        file_hash(f)
    assert reads == ["w.bin", "w.bin"]
    with remembered_hashes(memo):
        assert file_hash(f) == sha(b"a" * SIZE)
    assert reads == ["w.bin", "w.bin"]


def test_small_files_are_always_read(tmp_path, reads):
    f = old_file(tmp_path / "small.txt", b"x" * 100)
    with remembered_hashes(tmp_path / "memo.sqlite"):
        file_hash(f)
        file_hash(f)
    assert reads == ["small.txt", "small.txt"]
    assert not (tmp_path / "memo.sqlite").exists() or not sqlite3.connect(tmp_path / "memo.sqlite").execute(
        "SELECT count(*) FROM digests").fetchone()[0]


@pytest.mark.parametrize("damage", ["not a database", "a folder", "under a file"])
def test_a_broken_memo_falls_back_to_reading(tmp_path, reads, damage):
    f = old_file(tmp_path / "w.bin", b"a" * SIZE)
    memo = tmp_path / "memo.sqlite"
    if damage == "not a database":
        memo.write_bytes(b"garbage " * 100)
    elif damage == "a folder":
        memo.mkdir()
    else:  # its folder cannot be created
        (tmp_path / "cache").write_text("a file")
        memo = tmp_path / "cache" / "memo.sqlite"
    with remembered_hashes(memo):
        assert file_hash(f) == sha(b"a" * SIZE)
        assert file_hash(f) == sha(b"a" * SIZE)
    assert reads == ["w.bin", "w.bin"]


def test_the_memo_keeps_at_most_max_rows(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(HashMemo, "MAX_ROWS", 3)
    memo = tmp_path / "memo.sqlite"
    for i in range(5):
        with remembered_hashes(memo):  # each memo prunes once, at its first write
            file_hash(old_file(tmp_path / f"w{i}.bin", bytes([i]) * SIZE))
    rows = sqlite3.connect(memo).execute("SELECT path FROM digests ORDER BY read_ns").fetchall()
    assert [os.path.basename(os.fsdecode(p)) for (p,) in rows] == ["w2.bin", "w3.bin", "w4.bin"]


def test_freeze_dir_records_the_frozen_copy(tmp_path, reads, monkeypatch):
    """pi_ref's hash at SFT's end is remembered, so the flow's check of a reused SFT does not read pi_ref again;
    a later change to it is still found."""
    monkeypatch.setenv("RLHF_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "pi_ref"
    d.mkdir()
    old_file(d / "model.safetensors", b"m" * SIZE)
    digest = freeze_dir(d)
    assert reads == ["model.safetensors"]
    from rlhf.models import hash_memo_path

    with remembered_hashes(hash_memo_path()):
        assert content_hash(d) == digest
    assert reads == ["model.safetensors"]
    (d / "model.safetensors").chmod(0o644)
    time.sleep(0.02)
    (d / "model.safetensors").write_bytes(b"n" * SIZE)
    with remembered_hashes(hash_memo_path()):
        assert content_hash(d) != digest


def test_a_file_restored_just_now_with_an_old_mtime_is_read_after_its_ctime_tick(tmp_path, reads):
    """``cp -p`` leaves an old mtime and a fresh ctime: the racy rule looks at the ctime, so two restores in one
    tick cannot share a remembered digest."""
    src = old_file(tmp_path / "src.bin", b"a" * SIZE)
    f = tmp_path / "w.bin"
    f.write_bytes(src.read_bytes())
    st = src.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo):
        file_hash(f)
    assert time.time_ns() - f.stat().st_ctime_ns >= HashMemo.RACY_NS  # it waited for the ctime's tick to pass


def test_any_file_name_and_inode_number(tmp_path, reads):
    """A name that is not UTF-8 (the OS's bytes) is remembered like any other."""
    name = os.fsencode(str(tmp_path)) + b"/\xff-shard.bin"
    with open(name, "wb") as fh:
        fh.write(b"a" * SIZE)
    past = time.time() - 60
    os.utime(name, (past, past))
    with remembered_hashes(tmp_path / "memo.sqlite"):
        assert file_hash(name) == sha(b"a" * SIZE)
        assert file_hash(name) == sha(b"a" * SIZE)
    assert len(reads) == 1


def test_a_locked_memo_costs_at_most_one_timeout(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(HashMemo, "LOCK_TIMEOUT_S", 0.2)
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo):
        file_hash(old_file(tmp_path / "v.bin", b"v" * SIZE))
    holder = sqlite3.connect(memo)
    holder.execute("BEGIN EXCLUSIVE")
    files = [old_file(tmp_path / f"w{i}.bin", bytes([i]) * SIZE) for i in range(20)]
    t0 = time.perf_counter()
    with remembered_hashes(memo):
        assert [file_hash(f) for f in files] == [sha(bytes([i]) * SIZE) for i in range(20)]
    assert time.perf_counter() - t0 < 1.0
    holder.rollback()


def test_verify_hash_reads_every_byte_inside_a_memo(tmp_path, reads):
    from rlhf.checkpoint import verify_hash

    d = tmp_path / "pi_ref"
    d.mkdir()
    old_file(d / "model.safetensors", b"m" * SIZE)
    memo = tmp_path / "memo.sqlite"
    with remembered_hashes(memo):
        digest = content_hash(d)
        verify_hash(d, digest, when="before training")
    assert reads == ["model.safetensors", "model.safetensors"]
