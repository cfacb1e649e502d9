"""Shared judging code below the stages: judges, agreement statistics, reward-model scoring, the PPO unlock rule, the
programmatic style and refusal rules (``drift_rules``, ``refusal_rules``) and online RL's reward-hacking tripwires
(``tripwires``). Stages (gates, reward_model, ppo, the flywheel) import it; it imports only ``data`` and ``rlhf`` below
it (the label convention it judges in is ``data.labels``)."""
