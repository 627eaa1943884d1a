"""The GRPO objective and its update: named, registered parts (`advantages`, `aggregation`,
`surrogates`; their names in `choices`) combined into the importance-corrected policy loss
(`loss`, `clip`), token log-probs by chunked log-softmax (`logprobs`), and one optimizer step
over token-budgeted micro-batches (`update`)."""
