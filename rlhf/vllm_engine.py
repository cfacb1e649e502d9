"""Greedy generation through vLLM (``engine: vllm`` in the gate config): tensor parallel inside a process, data
parallel over the processes of the launch (``rlhf.distributed.map_sharded``), same prompts, truncation and outputs
as ``rlhf.generation.generate_report``.

NOT RUN in this repository's tests or benchmarks: vllm is not installed here and there is no GPU. What is tested is
the dispatch: asking for vLLM where it cannot run raises :class:`EngineUnavailable` before any model is loaded.
"""

from __future__ import annotations

import importlib.util
import os

ENGINES = ("transformers", "vllm")


class EngineUnavailable(RuntimeError):
    """The configured generation engine cannot run on this machine (the reason is in the message)."""


def check_engine(engine: str) -> None:
    """Raise unless ``engine`` can run here.

    Raises:
        ValueError: an unknown engine (names the known ones).
        EngineUnavailable: ``vllm`` asked for, but the ``vllm`` package is not importable or no CUDA GPU is visible
            (both conditions are named, with what to do instead).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine != "vllm":
        return
    import torch

    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package is not installed (pip install vllm)")
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU is visible (torch.cuda.is_available() is False)")
    if missing:
        raise EngineUnavailable(
            "engine: vllm was requested but cannot run here: " + "; ".join(missing)
            + ". Use engine: transformers (batched generate with the KV cache) on this machine."
        )


class VLLMGenerator:
    """One checkpoint loaded in vLLM, greedy decoding.

    Args:
        path: checkpoint directory (a Hugging Face layout vLLM reads).
        tensor_parallel_size: GPUs per process the model is split over. In a multi-process launch each process takes
            GPUs ``[local_rank * tp, (local_rank + 1) * tp)`` (``CUDA_VISIBLE_DEVICES`` set before vLLM starts).
        dtype: vLLM's ``dtype`` (``auto``: the checkpoint's, bf16 for the 8B recipes).
    """

    def __init__(self, path: str, *, tensor_parallel_size: int = 1, dtype: str = "auto", seed: int = 0):
        check_engine("vllm")
        tp = int(tensor_parallel_size)
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(local * tp + k) for k in range(tp))
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.llm = LLM(model=path, tensor_parallel_size=tp, dtype=dtype, seed=seed)

    def generate_report(self, prompts: list, *, max_new_tokens: int, max_prompt_length: int, desc: str = "",
                        shard: bool = True) -> tuple[list[str], list[int], list[bool]]:
        """``rlhf.generation.generate_report``'s contract through vLLM: ``(texts, n_tokens, truncated)`` in input
        order; prompts fitted by ``fit_prompt`` and sent as token ids (no second tokenization); n_tokens up to and
        including the EOS; texts decoded without special tokens."""
        from vllm import SamplingParams

        from .distributed import map_sharded
        from .generation import fit_prompt

        fitted = [fit_prompt(self.tokenizer, p, max_prompt_length) for p in prompts]
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t, _ in fitted]
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, seed=0)

        def run(idx: list[int]) -> list[tuple[str, int]]:
            outs = self.llm.generate([{"prompt_token_ids": ids[i]} for i in idx], params, use_tqdm=False)
            return [(self.tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True).strip(),
                     len(o.outputs[0].token_ids)) for o in outs]

        results = map_sharded(run, list(range(len(prompts))), shard=shard)
        return [t for t, _ in results], [n for _, n in results], [cut for _, cut in fitted]
