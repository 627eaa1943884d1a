"""A training job's memory floor: what weights, gradients, AdamW state, a KL reference, the
engine's copy and its KV pool need at the least (`estimate`), checked before any weights load,
and the tables of that rule for real model shapes (`table`)."""
