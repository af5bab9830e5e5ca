"""Algorithms that turn trajectories into better weights (GRPO family), prompts or fine-tunes."""
