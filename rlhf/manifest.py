"""Stage manifests: what a stage produced, from which inputs (DESIGN.md principle 8).

Every stage writes ``<output_dir>/manifest.json`` last, atomically, so a directory without a manifest is an
unfinished stage and a manifest never describes a half-written checkpoint.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .lineage import code_version, json_hash

MANIFEST_NAME = "manifest.json"


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically: temp file in the same directory, fsync, ``os.replace``.

    Readers see the old file or the new one, never a half-written one. Creates parent directories; on error the
    temp file is removed and ``path`` is untouched. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; reports and manifests are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


NULL_REASON_SUFFIX = "_null_reason"


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, +-Infinity) replaced by None, so it is strict JSON.

    In a mapping, a key whose value was non-finite gets a sibling ``<key>_null_reason`` saying what it was
    ("NaN: not measurable (no items, or an undefined ratio)" / "Infinity"), unless the mapping already has
    one; in a list the element just becomes None. Tuples become lists; other values are kept.
    """
    def why(x: float) -> str:
        return "NaN: not measurable (no items, or an undefined ratio)" if math.isnan(x) else f"{x}: not finite"

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[k] = strict_json(v)
            if isinstance(v, float) and not math.isfinite(v) and f"{k}{NULL_REASON_SUFFIX}" not in value:
                out[f"{k}{NULL_REASON_SUFFIX}"] = why(v)
        return out
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and type(value).__module__ == "numpy":
        return strict_json(value.item())
    return value


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`strict_json`(value) with ``allow_nan=False``: a NaN that slips through fails loudly."""
    return json.dumps(strict_json(value), allow_nan=False, **kwargs)


def records_up_to_step(path: str | os.PathLike, step: int, *, missing_step: float = 0) -> list[dict[str, Any]]:
    """The JSON-lines records of ``path`` whose ``step`` is at most ``step`` (a record without one counts as
    ``missing_step``), in file order; [] when the file does not exist. What a run resumed from ``checkpoint-<step>``
    keeps of the killed attempt's step records: later ones were made after that checkpoint and are made again.

    Raises:
        ValueError: a line is not JSON (names the file and line).
    """
    path = Path(path)
    kept: list[dict[str, Any]] = []
    if not path.is_file():
        return kept
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {i}: not JSON ({err.msg})") from None
        if record.get("step", missing_step) <= step:
            kept.append(record)
    return kept


def write_manifest(output_dir: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write ``manifest`` (plus ``finished_at``) to ``output_dir/manifest.json`` atomically; returns the path."""
    manifest = {**manifest, "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat()}
    path = Path(output_dir) / MANIFEST_NAME
    atomic_write_text(path, dumps_strict(manifest, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_manifest(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Read ``output_dir/manifest.json``.

    Raises:
        FileNotFoundError: the stage never finished (no manifest), with the directory named.
    """
    path = Path(output_dir) / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest; the stage in {output_dir} did not finish")
    return json.loads(path.read_text())


def precision_name(args) -> str:
    """The dtype a TRL config trains in: ``bf16``, ``fp16`` or ``fp32`` (from its resolved ``bf16``/``fp16``)."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def stage_manifest(
    stage: str,
    args,
    *,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    metrics: dict[str, Any],
    precision: str | None = None,
    extra: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write ``<output_dir>/manifest.json`` with lineage: input hashes, config hash, code version, outputs, metrics.

    Args:
        args: the stage's parsed config: any object whose ``vars()`` are its settings, with ``output_dir`` and
            ``round_id`` (and ``bf16``/``fp16`` for a TRL config, unless ``precision`` is given).
        precision: the dtype the stage trained in (``fp32``/``bf16``/``fp16``); default from ``args.bf16``/``fp16``;
            a stage that trains nothing (no ``precision``, no ``bf16`` field: the gate stage) records none.
        extra: more top-level entries (e.g. library versions).
        config: the settings to record and hash, where ``vars(args)`` is not the form (``dataclasses.asdict`` of a
            config holding nested dataclasses).

    Returns:
        The manifest's path; the manifest holds ``stage, round_id, inputs, config, config_hash, code_version,
        precision, outputs, metrics`` (+ ``extra``, ``finished_at``).
    """
    if config is None:
        config = {k: v for k, v in sorted(vars(args).items()) if not k.startswith("_")}
    if precision is None and hasattr(args, "bf16"):
        precision = precision_name(args)
    return write_manifest(
        args.output_dir,
        {
            "stage": stage,
            "round_id": args.round_id,
            "inputs": inputs,
            "config_hash": json_hash(config),
            "config": config,
            "code_version": code_version(),
            **({"precision": precision} if precision is not None else {}),
            "outputs": outputs,
            "metrics": metrics,
            **(extra or {}),
        },
    )
