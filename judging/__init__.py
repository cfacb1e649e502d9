"""Shared judging code below the stages: judges, agreement statistics, reward-model scoring and the PPO unlock rule.
Stages (gates, reward_model, ppo, the flywheel) import it; it imports only ``data`` and ``rlhf`` below it (the label
convention it judges in is ``data.labels``)."""
