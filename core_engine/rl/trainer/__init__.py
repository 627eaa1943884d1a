"""The GRPO trainer: the one training loop over a rollout source (`grpo`), the policy it trains
(`policy`), which groups it trains on (`screen`), its optimizer, per-version checkpoints,
held-out evaluation, and the metrics and records of each step."""
