"""The GRPO objective and its update: advantages and the clipped, importance-corrected policy
loss as pure tensor functions (`loss`, `clip`), token log-probs by chunked log-softmax
(`logprobs`), and one optimizer step over token-budgeted micro-batches (`update`)."""
