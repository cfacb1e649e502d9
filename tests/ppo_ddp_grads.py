"""One PPO mini-batch's accumulated gradient on N processes (used by tests/test_ppo_trainer.py).

    python -m torch.distributed.run --nproc_per_node N tests/ppo_ddp_grads.py OUT.pt

A fixed rollout of 4 completions of 1, 13, 2 and 8 real tokens (the same tensors on every process, from a seeded
generator) is split across the N processes (4 / N rows each); each process runs ``PPOTrainer.accumulate_minibatch``
on its rows in micro-batches of 1 under DDP (gloo), which averages the gradients at the last micro-batch. Rank 0
saves the resulting gradient of every parameter to ``OUT.pt``. With the mini-batch's token count all-reduced
(``PPOTrainer.minibatch_token_normalizer``) the gradient is the same for every N.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from char_tokenizer import build_tiny_tokenizer  # noqa: E402

from ppo.config import PPOConfig  # noqa: E402
from ppo.trainer import PPOTrainer  # noqa: E402
from ppo.types import Rollout  # noqa: E402
from rlhf.distributed import init_state  # noqa: E402
from rlhf.models import build_tiny_models  # noqa: E402
from rlhf.precision import stage_accelerator  # noqa: E402

LENGTHS = (1, 13, 2, 8)


def main(out: str) -> None:
    init_state()  # the process group as ppo.train makes it (rlhf.entrypoint.setup_stage): gloo on CPU
    tokenizer = build_tiny_tokenizer()
    models = build_tiny_models(tokenizer, seed=0)
    accelerator = stage_accelerator("no")
    n, rank = accelerator.num_processes, accelerator.process_index
    if n != int(__import__("os").environ.get("WORLD_SIZE", "1")):
        raise RuntimeError(f"accelerate sees {n} process(es), the launch has {__import__('os').environ['WORLD_SIZE']}")
    per = len(LENGTHS) // n
    config = PPOConfig(batch_size=per, mini_batch_size=per, micro_batch_size=1, num_steps=1, output_dir="unused",
                       seed=0, precision="fp32")
    prompts = [f"prompt {i}" for i in range(8)]
    trainer = PPOTrainer(config, models["policy"], models["ref"], models["reward"], models["value"], tokenizer,
                         prompts, accelerator=accelerator)
    g = torch.Generator().manual_seed(0)
    B, P, T, V = len(LENGTHS), 5, max(LENGTHS), len(tokenizer)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    full = Rollout(
        prompt_ids=torch.randint(4, V, (B, P), generator=g), prompt_mask=torch.ones(B, P, dtype=torch.long),
        prompt_index=torch.arange(B), completion_ids=torch.randint(4, V, (B, T), generator=g), completion_mask=mask,
        logprobs=-3.0 + 0.3 * torch.randn(B, T, generator=g), ref_logprobs=torch.zeros(B, T),
        values=torch.randn(B, T, generator=g) * mask, scores=torch.zeros(B), penalized_scores=torch.zeros(B),
        rewards=torch.zeros(B, T), kl_k1=torch.zeros(B, T), kl_k3=torch.zeros(B, T),
        advantages=torch.randn(B, T, generator=g) * mask, returns=torch.randn(B, T, generator=g) * mask,
    )
    mine = Rollout(*(t[rank * per : (rank + 1) * per] for t in full))
    trainer.model.train()
    trainer.accumulate_minibatch(mine, torch.arange(per))
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(trainer.model)
        torch.save({k: p.grad.detach().clone() for k, p in unwrapped.named_parameters() if p.grad is not None}, out)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
