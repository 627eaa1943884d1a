"""The one seed rule: every sampled token's seed is a function of (job seed, batch, sample,
turn), whatever produces it (single-turn generation, an episode's turns, a rank's share), so a
sample draws the same tokens on one process or on several ranks, and a resumed run draws what
the straight run drew."""

TURN_STRIDE = 1 << 32  # between one turn's seeds and the next's: no batch holds that many samples


def batch_seed(seed: int, index: int) -> int:
    """The sampling seed of batch `index` of a job seeded `seed` (pipelined: known before the
    trainer reaches it)."""
    return seed * 1_000_003 + index * 10_007


def sample_seed(seed: int, sample: int, turn: int = 0) -> int:
    """The seed of sample `sample` (its index in the batch, sample-major within groups) at turn
    `turn` of a batch seeded `seed`. A rank's share is seeded `sample_seed(seed, first)`, its
    first sample's, so its samples' seeds are the whole batch's."""
    return seed + sample + turn * TURN_STRIDE
