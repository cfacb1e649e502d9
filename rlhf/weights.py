"""Loading a checkpoint without training on random weights, and copying one atomically.

``from_pretrained`` fills any weight the checkpoint lacks with fresh random values and only logs a notice
("newly initialized"). A stage that trains or judges from such a model produces a manifest that looks fine
(issue 9, point 3). ``load_checked`` asks transformers for its loading report (``output_loading_info=True``) and
refuses a checkpoint with missing or shape-mismatched weights, naming the file and the tensors. A stage that
creates a head on purpose (the reward model's ``score``) names it in ``new_heads``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class IncompleteCheckpoint(RuntimeError):
    """A checkpoint lacks weights the model needs (they would be random); names the files and tensors."""


def _weight_files(path: str | os.PathLike) -> str:
    files = sorted(str(p) for p in Path(path).glob("*.safetensors")) or sorted(str(p) for p in Path(path).glob("*.bin"))
    return ", ".join(files) if files else str(path)


def _is_new_head(key: str, heads: Iterable[str]) -> bool:
    return any(key == h or key.startswith(f"{h}.") or f".{h}." in f".{key}" for h in heads)


def load_checked(cls: Any, path: str | os.PathLike, *, what: str, new_heads: Iterable[str] = (), **kwargs: Any):
    """``cls.from_pretrained(path, **kwargs)``, refusing weights that would be newly initialised.

    Args:
        cls: a transformers auto class or model class (``AutoModelForCausalLM``, ...).
        path: a local checkpoint directory (or hub id).
        what: what the model is for, used in the error (``"SFT base model"``).
        new_heads: module names the stage creates on purpose (``["score"]`` for a reward model built from a
            causal LM); their weights may be missing.

    Returns:
        The loaded model.

    Raises:
        IncompleteCheckpoint: missing or shape-mismatched tensors outside ``new_heads``, naming the weight files
            and every such tensor.
    """
    heads = tuple(new_heads)
    model, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
    missing = sorted(k for k in info.get("missing_keys") or [] if not _is_new_head(k, heads))
    mismatched = sorted(str(m[0] if isinstance(m, (tuple, list)) else m) for m in info.get("mismatched_keys") or [])
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing tensor(s): {', '.join(missing)}")
        if mismatched:
            parts.append(f"{len(mismatched)} tensor(s) of the wrong shape: {', '.join(mismatched)}")
        raise IncompleteCheckpoint(
            f"{what} {_weight_files(path)}: {'; '.join(parts)}; they would be newly initialised (random). "
            "Refusing to train or evaluate on a partial checkpoint."
        )
    return model


def atomic_copytree(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy directory ``src`` to ``dst`` via a temporary sibling folder and one rename.

    A reader sees no ``dst`` or a complete one, never a half-copied checkpoint. An existing ``dst`` is replaced.
    On error the temporary folder is removed and ``dst`` is untouched.
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}."))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        tmp.chmod(0o755)
        if dst.exists():
            old = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.old."))
            os.replace(dst, old / dst.name)
            os.replace(tmp, dst)
            _rmtree_writable(old)
        else:
            os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _rmtree_writable(path: Path) -> None:
    import stat

    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(path)
