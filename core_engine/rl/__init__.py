"""GRPO training on rollouts from our engine: data, rewards, rollouts, loss and the loop."""
