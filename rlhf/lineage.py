"""Lineage (DESIGN.md principle 8): content hashes, and the code each stage runs.

Caches are keyed on content, never on a path: a file that changed under the same name gets a new hash. A stage's
code version covers exactly the modules it imports (read from the source, file level and inside functions,
followed transitively from its entry module), so a change in a module recomputes every stage that runs it and no
other. A hub model or dataset is keyed by the commit its id resolves to (:func:`hub_key`), never by its name: a
repository pushed to under the same name is other content. (Data sources are fingerprinted by
``data.fingerprint``, one layer up.)
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
import hashlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .registry import PROJECT_PACKAGES
from .registry import stage as registry_stage

_CHUNK = 1 << 20  # 1 MiB reads keep memory flat on multi-GB checkpoints


def _read_hash(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hash(path: str | os.PathLike) -> str:
    """sha256 hex digest of one file's bytes; inside :func:`remembered_hashes`, a large file whose stat is unchanged
    since it was last read is not read again."""
    memo = _MEMO.get()
    return _read_hash(path) if memo is None else memo.file_hash(path)


class HashMemo:
    """sha256 digests of large files remembered by path and stat signature (device, inode, size, mtime and ctime
    in ns) in one SQLite file, so that a multi-GB checkpoint is not read again only to learn that it is unchanged,
    as git's index does for ``git status`` (DVC's state database keys on inode, mtime and size the same way).

    A remembered digest is used while all five stat fields match. Writing a file's bytes sets its mtime and ctime;
    restoring an old mtime (``touch -d``, ``cp -p``, ``rsync -t``, an archive's extraction) sets its ctime to now,
    which user space cannot set back. A digest is remembered only when the file's last change (its ctime, never
    earlier than its mtime) lies at least :data:`RACY_NS` before it was read (git's "racy clean" rule): the file
    system stamps a change with a coarse clock, so a change in the same clock tick as the one read could leave the
    signature unchanged. Not seen: bytes written through a shared memory map to a page already dirty (the kernel
    updates no time for them), and a file changed on another machine whose clock runs behind this one's (a network
    file system). This detects accidental change, not tampering (whoever can write the files can write this
    database too); the checks that must see every byte (pi_ref verified before and after training, a resumed
    checkpoint's file hashes) read them outside any memo (:func:`every_byte`).

    A database that is locked, read-only or not a database, or a path it cannot store, makes it read the file as
    without a memo (and stop asking the database for the rest of this memo's use). Files under
    :data:`MEMO_MIN_BYTES` are always read (about a lookup's cost).

    Args:
        path: the SQLite file (created with its folder when missing).
        reuse: use remembered digests; False: only remember what is read (a stage hashing what it just wrote).
    """

    #: Files smaller than this are read, not looked up (1 MiB reads in about the time of a lookup).
    MEMO_MIN_BYTES = 1 << 20
    #: How long before its reading a file's last change must lie for its digest to be remembered: Linux stamps
    #: changes with a coarse clock whose tick is at most 10 ms (HZ >= 100), so two ticks; a file changed more
    #: recently is read once that time has passed. File systems with whole-second stamps (a ctime that is a
    #: multiple of 1 s) get 2 s, and are not waited for.
    RACY_NS = 20_000_000
    COARSE_RACY_NS = 2_000_000_000
    #: Rows kept; the oldest beyond this are dropped (files deleted since stay until then).
    MAX_ROWS = 100_000
    #: Seconds to wait for a database another process is writing (a row's write takes milliseconds).
    LOCK_TIMEOUT_S = 0.5

    def __init__(self, path: str | os.PathLike, *, reuse: bool = True) -> None:
        self.path, self.reuse = Path(path), reuse
        self._created = self._pruned = self._broken = False
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> HashMemo:
        """Within the block, :func:`file_hash` goes through this memo (re-entrant: a later block may use it again)."""
        self._tokens.append(_MEMO.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _MEMO.reset(self._tokens.pop())

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # a connection per use, never shared: a context copied into another thread (Prefect runs tasks in worker
        # threads) may use the same memo
        if not self._created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.path, timeout=self.LOCK_TIMEOUT_S)
        try:
            with con:
                if not self._created:  # the path as the OS's bytes, the signature as text: any name, any inode
                    con.execute("CREATE TABLE IF NOT EXISTS digests (path BLOB PRIMARY KEY, signature TEXT, "
                                "sha256 TEXT, read_ns INTEGER)")
                    con.execute("CREATE INDEX IF NOT EXISTS digests_read_ns ON digests (read_ns)")
                    self._created = True
                yield con
        finally:
            con.close()

    @staticmethod
    def _signature(st: os.stat_result) -> str:
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def _lookup(self, key: bytes) -> tuple[str, str] | None:
        try:
            with self._db() as con:
                return con.execute("SELECT signature, sha256 FROM digests WHERE path = ?", (key,)).fetchone()
        except (sqlite3.Error, OSError, ValueError):  # locked, not a database, an unwritable folder
            self._broken = True
            return None

    def _remember(self, key: bytes, signature: str, digest: str, read_ns: int) -> None:
        try:
            with self._db() as con:
                con.execute("INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?)", (key, signature, digest, read_ns))
                if not self._pruned:  # once per memo: the walk over the index costs a few ms at MAX_ROWS
                    con.execute("DELETE FROM digests WHERE read_ns < (SELECT read_ns FROM digests ORDER BY read_ns "
                                "DESC LIMIT 1 OFFSET ?)", (self.MAX_ROWS - 1,))
                    self._pruned = True
        except (sqlite3.Error, OSError, ValueError):  # not remembered: the next reading reads it again
            self._broken = True

    def file_hash(self, path: str | os.PathLike) -> str:
        """:func:`file_hash` of ``path``: the remembered digest where the signature matches, else read (and
        remembered unless racy or changed while read).

        Raises:
            OSError: the file cannot be read (as without a memo).
        """
        key = os.path.realpath(path)
        before = os.stat(key)
        if before.st_size < self.MEMO_MIN_BYTES or self._broken:
            return _read_hash(key)
        signature, encoded = self._signature(before), os.fsencode(key)
        if self.reuse:
            row = self._lookup(encoded)
            if row is not None and row[0] == signature:
                return row[1]
        changed = max(before.st_mtime_ns, before.st_ctime_ns)
        racy = self.COARSE_RACY_NS if changed % 1_000_000_000 == 0 else self.RACY_NS
        wait = racy - (time.time_ns() - changed)
        if racy == self.RACY_NS and 0 < wait <= racy:  # changed in the last ticks (a stage's own checkpoint, just
            time.sleep(wait / 1e9)  # frozen read-only): wait them out, so it can be remembered
        read_ns = time.time_ns()
        digest = _read_hash(key)
        if read_ns - changed >= racy and self._signature(os.stat(key)) == signature and not self._broken:
            self._remember(encoded, signature, digest, read_ns)
        return digest


_MEMO: contextvars.ContextVar[HashMemo | None] = contextvars.ContextVar("rlhf_hash_memo", default=None)


@contextlib.contextmanager
def every_byte() -> Iterator[None]:
    """Within the block, :func:`file_hash` reads every file whatever memo the caller is in: for the checks that
    must see the bytes themselves (pi_ref's hash before and after training)."""
    token = _MEMO.set(None)
    try:
        yield
    finally:
        _MEMO.reset(token)


def remembered_hashes(path: str | os.PathLike, *, reuse: bool = True) -> HashMemo:
    """A :class:`HashMemo` at ``path`` (the project's: ``rlhf.models.hash_memo_path``) to use as a context: within
    the block, :func:`file_hash` (and so :func:`content_hash`, ``data.fingerprint.data_fingerprint``,
    :func:`source_key`) goes through it; ``reuse=False`` only records what is read."""
    return HashMemo(path, reuse=reuse)


def content_hash(path: str | os.PathLike, *, exclude: tuple[str, ...] = ("manifest.json",)) -> str:
    """sha256 of a file, or of a directory tree (relative paths + bytes, sorted).

    Args:
        path: a file or a directory.
        exclude: file names skipped anywhere in a directory (the manifest describes the content, it is not part of it).

    Returns:
        64-char hex digest. Two trees hash equal iff they hold the same relative paths with the same bytes.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"cannot hash {p}: no such file or directory")
    if p.is_file():
        return file_hash(p)
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file() and q.name not in exclude and "__pycache__" not in q.parts):
        h.update(f.relative_to(p).as_posix().encode())
        h.update(b"\0")
        h.update(file_hash(f).encode())
    return h.hexdigest()


class UnresolvedRevision(ValueError):
    """A hub id whose commit cannot be found (not in the local hub cache, and the hub offline or unreachable)."""


def _hub_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_revision(repo_id: str, *, repo_type: str = "model", revision: str | None = None) -> str:
    """The commit sha a hub id (and optional branch, tag or commit) resolves to.

    Offline (``HF_HUB_OFFLINE``), from the local hub cache: the snapshot ``huggingface_hub`` itself would load
    (``snapshot_download(local_files_only=True)`` follows ``refs/<revision>`` to ``snapshots/<commit>``). Online,
    the hub's answer (``HfApi.repo_info``), which is what a load would fetch; the cache when the hub is unreachable.

    Args:
        repo_id: ``org/name``. repo_type: ``model`` or ``dataset``. revision: default the repository's ``main``.

    Returns:
        The 40-hex commit.

    Raises:
        UnresolvedRevision: not in the cache and the hub offline or unreachable (names the id and the cache).
    """
    import huggingface_hub
    from huggingface_hub import constants

    if not _hub_offline():
        try:
            info = huggingface_hub.HfApi().repo_info(repo_id, repo_type=repo_type, revision=revision)
            if info.sha:
                return info.sha
        except Exception:  # unreachable, unknown id, no auth: fall back to what this machine has
            pass
    try:
        snapshot = huggingface_hub.snapshot_download(repo_id, repo_type=repo_type, revision=revision,
                                                     local_files_only=True)
    except Exception as err:
        raise UnresolvedRevision(
            f"{repo_type} {repo_id}{'@' + revision if revision else ''}: cannot resolve which commit it names (not in "
            f"the local hub cache {constants.HF_HUB_CACHE} and the hub is offline or unreachable: "
            f"{type(err).__name__}); a result keyed by the name alone could be another revision's, so download it "
            "first or pass a local path"
        ) from None
    return Path(snapshot).name


def hub_key(repo_id: str, *, repo_type: str = "model") -> str:
    """``hub:<repo_type>:<repo_id>@<commit>`` (:func:`hub_revision`): the cache identity of a hub model or dataset.

    Raises:
        UnresolvedRevision: see :func:`hub_revision`.
    """
    return f"hub:{repo_type}:{repo_id}@{hub_revision(repo_id, repo_type=repo_type)}"


_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
#: Suffixes of files, never of hub repository names (``org/pairs.jsonl`` is a file that is not there yet).
_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".tsv", ".parquet", ".arrow", ".yaml", ".yml", ".txt", ".gz", ".gguf",
                  ".safetensors", ".bin", ".pt")


def source_key(value: str, *, repo_type: str = "model") -> str:
    """The cache identity of a model or dataset named by a local path (its :func:`content_hash`) or a hub id
    (:func:`hub_key`). A path that does not exist yet (absolute, relative with ``./`` or ``~``, a file suffix, or
    no valid repository id; e.g. a file the flow writes before the stage runs) is ``path:<value>``.

    Raises:
        UnresolvedRevision: a hub id whose commit cannot be resolved.
    """
    p = Path(value).expanduser()
    if p.exists():
        return content_hash(p)
    repo_id = value.removeprefix("hub:")
    if (value.startswith(("/", ".", "~")) or value.lower().endswith(_FILE_SUFFIXES)
            or not _REPO_ID.match(repo_id)):
        return f"path:{value}"
    return hub_key(repo_id, repo_type=repo_type)


def json_hash(obj: Any) -> str:
    """sha256 of a JSON-serialisable object in canonical form (sorted keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# Where the project's packages sit: the checkout (editable install), or site-packages (wheel install), whose
# installed .py files are then what is hashed. Only the folders of PROJECT_PACKAGES are read, never the rest.
ROOT = Path(__file__).resolve().parent.parent


class Import(NamedTuple):
    """One project module imported by one statement."""

    line: int  # line of the import statement
    module: str  # the imported project module, e.g. "data.labels"
    in_function: bool  # inside a function (runs when called) rather than at file level (runs on import)


def project_modules(root: str | os.PathLike = ROOT, packages: Iterable[str] = PROJECT_PACKAGES) -> dict[str, Path]:
    """Module name -> source file of every .py file of ``packages`` under ``root``, sorted by name.

    ``pkg/__init__.py`` is module ``pkg``; a folder without ``__init__.py`` (a namespace package) has no file of its
    own, its modules still count. A package folder that is absent is skipped.
    """
    root = Path(root)
    out = {}
    for pkg in packages:
        for f in (root / pkg).rglob("*.py"):
            if "__pycache__" in f.parts:
                continue
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return dict(sorted(out.items()))


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def module_imports(module: str, path: str | os.PathLike, modules: Mapping[str, Path]) -> list[Import]:
    """The project modules one source file imports, at file level and inside functions, read with :mod:`ast`
    (nothing is executed).

    ``import a.b.c`` imports ``a``, ``a.b`` and ``a.b.c`` (importing a module runs its packages' ``__init__``);
    ``from a.b import c`` imports ``a``, ``a.b`` and, when ``a.b.c`` is a module, that too; relative imports resolve
    against ``module``'s package. Only names in ``modules`` count (the standard library and third-party packages
    are left out), and neither ``module`` itself nor its own packages do (they are imported before it runs).

    Args:
        module: the file's module name (``"data.schemas"``; a package's ``__init__.py`` is the package's name).
        path: the file.
        modules: the project's modules (:func:`project_modules`).

    Returns:
        One :class:`Import` per (statement, imported module), in source order.

    Raises:
        SyntaxError: the file does not parse.
    """
    path = Path(path)
    st = path.stat()
    out = []
    stat_key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    for line, targets, in_function in _import_statements(module, str(path), stat_key):
        for m in targets:
            # a module's own packages are being imported already when it runs (Python imports a.b before a.b.c),
            # so "from a.b import x" in a.b.c is no edge back to a.b
            if m in modules and m != module and not module.startswith(f"{m}."):
                out.append(Import(line, m, in_function))
    return out


_Statement = tuple[int, tuple[str, ...], bool]  # line, every module the statement imports, inside a function


@functools.lru_cache(maxsize=4096)
def _import_statements(module: str, path: str, stat_key: tuple[int, ...]) -> tuple[_Statement, ...]:
    """Each import statement of ``path``, read as ``module``; remembered by the file's stat (``stat_key``: device,
    inode, size, mtime, ctime), so the flow, which follows every stage's imports, parses each file once while it is
    unchanged."""
    package = module.split(".") if Path(path).name == "__init__.py" else module.split(".")[:-1]
    out: list[_Statement] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [m for alias in node.names for m in _prefixes(alias.name)]
        if node.level - 1 > len(package):
            return []  # beyond the top level: Python refuses it too
        prefix = ".".join(package[: len(package) - (node.level - 1)]) if node.level else ""
        # "from .. import sft" one level below the top names top-level modules; Python refuses it at run time,
        # counting it keeps the layer check strict
        base = ".".join(p for p in (prefix, node.module) if p)
        names = [f"{base}.{a.name}" if base else a.name for a in node.names if a.name != "*"]
        return (_prefixes(base) if base else []) + names

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child.lineno, tuple(dict.fromkeys(targets(child))), in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(Path(path).read_text(encoding="utf-8"), filename=path), False)
    return tuple(out)


def import_graph(root: str | os.PathLike = ROOT, packages: Iterable[str] = PROJECT_PACKAGES) -> dict[str, list[Import]]:
    """Every project module -> the project modules it imports (:func:`module_imports`)."""
    modules = project_modules(root, packages)
    return {m: module_imports(m, f, modules) for m, f in modules.items()}


def code_modules(
    entries: Iterable[str], root: str | os.PathLike = ROOT, packages: Iterable[str] = PROJECT_PACKAGES
) -> tuple[str, ...]:
    """``entries`` and every project module they import, transitively, at file level and inside functions (a lazy
    import runs when the stage calls that function), with the package ``__init__`` modules each import runs.

    This is the code a stage runs, so it is what its cache key follows (:func:`code_version`): a change in one of
    these modules recomputes the stage, a change in any other module does not.

    Returns:
        Sorted module names, e.g. ``("data", "data.schemas", ..., "sft.train")``.

    Raises:
        ValueError: an entry that is not a module of ``packages`` under ``root``.
    """
    modules = project_modules(root, packages)
    seen: set[str] = set()
    todo = []
    for entry in entries:
        if entry not in modules:
            raise ValueError(f"{entry!r} is not a module of {', '.join(packages)} under {root}")
        todo += [m for m in _prefixes(entry) if m in modules]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [i.module for i in module_imports(m, modules[m], modules) if i.module not in seen]
    return tuple(sorted(seen))


def stage_code_modules(stage: str, root: str | os.PathLike = ROOT) -> tuple[str, ...]:
    """The modules a registry stage runs: :func:`code_modules` from its entry module and its config modules (the
    flow parses the recipe with those before the stage starts).

    Raises:
        ValueError: an unknown stage.
    """
    entry = registry_stage(stage)
    return code_modules((entry.module, *(c.split(":")[0] for c in entry.configs)), root)


def code_packages(stage: str, root: str | os.PathLike = ROOT) -> tuple[str, ...]:
    """The top-level packages of :func:`stage_code_modules`, sorted; e.g. ``sft`` -> ``("data", "rlhf", "sft")``.

    For reading (what a stage depends on); the cache key follows the modules themselves.
    """
    return tuple(sorted({m.split(".")[0] for m in stage_code_modules(stage, root)}))


def code_version(
    modules: Iterable[str] | None = None, root: str | os.PathLike = ROOT, packages: Iterable[str] = PROJECT_PACKAGES
) -> str:
    """Hash of the pipeline's own source: the files of ``modules`` (default: every project module).

    A change to the code a stage runs changes its value, so a cached result computed by older code is not reused.
    Computed from the files on disk (a checkout, or the installed package), so it needs no git.

    Returns:
        64-char hex digest over each module's relative path and file hash, in module-name order.

    Raises:
        KeyError: a module that is not one of ``packages`` under ``root``.
    """
    root = Path(root)
    files = project_modules(root, packages)
    h = hashlib.sha256()
    for m in sorted(files) if modules is None else sorted(set(modules)):
        h.update(files[m].relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(file_hash(files[m]).encode())
    return h.hexdigest()
