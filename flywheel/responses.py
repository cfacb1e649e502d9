"""More responses for a selected turn, sampled from the current policy (so the next round's pairs are on-policy)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["PolicySampler"]


class PolicySampler:
    """Nucleus sampling from a policy checkpoint (a stage dir with manifest.json, or a checkpoint dir).

    Args:
        path: the policy. max_new_tokens: cap per response. temperature, top_p: sampling. seed: torch seed.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.8,
        top_p: float = 0.95,
        seed: int = 0,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rlhf.manifest import read_manifest

        p = Path(path)
        ckpt = read_manifest(p)["outputs"]["checkpoint"] if (p / "manifest.json").is_file() else str(p)
        self.tok = AutoTokenizer.from_pretrained(ckpt)
        self.model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        torch.manual_seed(seed)

    def sample(self, messages: list[dict], n: int) -> list[str]:
        """``n`` sampled replies to ``messages`` (ending on a user turn); empty replies are dropped."""
        import torch

        from rlhf.generation import chat_prompt

        enc = self.tok(chat_prompt(self.tok, messages), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            gen = self.model.generate(
                **enc,
                do_sample=True,
                temperature=self.temperature,
                top_p=self.top_p,
                max_new_tokens=self.max_new_tokens,
                num_return_sequences=n,
                pad_token_id=self.tok.pad_token_id,
            )
        new = gen[:, enc["input_ids"].shape[1] :]
        return [t for t in (self.tok.decode(row, skip_special_tokens=True).strip() for row in new) if t]
