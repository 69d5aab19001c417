"""Reinforcement learning from a reward that can be checked (data.format=rl, docs/rl.md).

grpo.py holds the update (group-relative advantages and the policy-gradient loss), rewards.py the
reward functions and the checks on them, rollouts.py the data: prompts answered in groups by the
model being trained, scored and handed to the loop as batches.
"""
