"""Shared judging code below the stages: one label convention, agreement statistics, reward-model scoring and
the PPO unlock rule. Stages (gates, reward_model, ppo, the flywheel) import it; it imports no stage."""
