"""The builders of the policies the package ships (their checkpoints and names:
`core_engine.assets`): each warms a tiny model up on its task (`warmup`) until RL can take
over, and saves it with a record of how it was built. Not part of the RL core, which never
imports this package: a job names a shipped policy, and `core_engine.assets` resolves the
name to its checkpoint."""
