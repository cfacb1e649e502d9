"""The one list of the pipeline's stages. Every other list derives from it: the flow's stage set and recipe
files, the CLI's stage commands and their help, the recipe/override checks, and each stage's cache-key code set.

Entries are plain strings (module paths), so ``rlhf`` never imports a stage: a stage's module is imported only
when it runs, and the code it depends on is read from its source (:func:`rlhf.lineage.stage_code_modules`).
:data:`LAYERS` places every package of the project, stages included, in the import order the layer tests enforce.

    name          the stage's one name: key in the flow, the round manifest and ``--set <name>.key=value``, its
                  output folder, its recipe ``recipes/<preset>/<name>.yaml`` and its command ``rlhf <name>``
    package       the stage's own package
    module        what ``accelerate launch -m <module>`` runs (it has a ``main(argv)``)
    configs       ``"module:Class"`` of the dataclass(es) its parser reads, in parser order
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage of a round (see the module docstring for the fields)."""

    name: str
    package: str
    module: str
    configs: tuple[str, ...]

    def config_classes(self) -> tuple[type, ...]:
        """Import and return the config dataclasses (imports the stage's config module, not its training code)."""
        out = []
        for path in self.configs:
            module, cls = path.split(":")
            out.append(getattr(importlib.import_module(module), cls))
        return tuple(out)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("sft", "sft", "sft.train", ("sft.config:SFTStageConfig",)),
        Stage("dpo", "dpo", "dpo.train", ("dpo.config:DPOStageConfig",)),
        Stage("reward_model", "reward_model", "reward_model.train", ("reward_model.config:RewardStageConfig",)),
        Stage("ppo", "ppo", "ppo.train", ("ppo.config:PPOScriptArguments", "ppo.config:PPOConfig")),
        # the online-RL alternatives to PPO on TRL (a round runs one of ppo / grpo / rloo: its online_rl)
        Stage("grpo", "grpo", "grpo.train", ("grpo.config:GRPOStageConfig",)),
        Stage("rloo", "rloo", "rloo.train", ("rloo.config:RLOOStageConfig",)),
        Stage("gates", "gates", "gates.evaluate", ("gates.config:GateStageConfig",)),
    )
}


#: The project's packages by layer, top to bottom. A package imports only its own modules and packages of the
#: layers below its own (never one beside it: a stage never imports another stage). The stages' layer is the
#: registry's packages plus the flywheel (a stage the round flow does not launch). Below it, the shared packages
#: one per layer: judging (judges, agreement) > data (schemas, loaders, labels, validation, decontamination)
#: > rlhf (plumbing). Checked on the source by tests/test_layers.py, and drawn in the README's Layout section.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("flows",),
    (*dict.fromkeys(s.package for s in STAGES.values()), "flywheel"),
    ("judging",),
    ("data",),
    ("rlhf",),
)

#: Every top-level package of the project (what ``pyproject.toml`` installs), sorted.
PROJECT_PACKAGES: tuple[str, ...] = tuple(sorted(p for layer in LAYERS for p in layer))


def stage(name: str) -> Stage:
    """The registry entry of ``name``.

    Raises:
        ValueError: an unknown stage, naming the known ones.
    """
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return STAGES[name]

