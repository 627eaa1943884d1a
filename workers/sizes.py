"""What a job may ask of a worker: how large it may be (`workers.specs.check_sizes` reads a
job's numbers, this module says what is too large).

Sizes (environment, defaults): ``RLWB_MAX_STEP_TOKENS`` prompts x group x max_tokens of one
step (4,194,304), ``RLWB_MAX_STEPS`` (1,000,000), ``RLWB_MAX_NEW_TOKENS`` per sample (32,768),
``RLWB_MAX_EVAL_PROMPTS`` (100,000), and the footprint rule: one step's rollouts must fit in
``RLWB_HOST_MEMORY`` bytes (default: the physical memory of the machine that checks, the
worker's when it re-checks).
"""

import os

from core_engine.rl.limits import GIB, describe_rollout_bytes, rollout_host_bytes

_DEFAULTS = {
    "RLWB_MAX_STEP_TOKENS": 4_194_304,
    "RLWB_MAX_STEPS": 1_000_000,
    "RLWB_MAX_NEW_TOKENS": 32_768,
    "RLWB_MAX_EVAL_PROMPTS": 100_000,
}


def _limit(name: str) -> int:
    return int(os.environ.get(name) or _DEFAULTS[name])


def host_memory_bytes() -> int:
    """What a worker's host can hold: ``RLWB_HOST_MEMORY`` (bytes), else this machine's
    physical memory."""
    configured = os.environ.get("RLWB_HOST_MEMORY")
    if configured:
        return int(configured)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _new_tokens_problems(tokens: int) -> list[str]:
    if tokens > _limit("RLWB_MAX_NEW_TOKENS"):
        return [f"max_tokens {tokens} > {_limit('RLWB_MAX_NEW_TOKENS')}"]
    return []


def _footprint_problems(samples: int, tokens: int) -> list[str]:
    """The footprint rule: a prompt is at least one token, so each sample holds
    1 + max_tokens."""
    if rollout_host_bytes(samples, 1 + tokens) <= (memory := host_memory_bytes()):
        return []
    return [
        f"footprint: one step's rollouts need at least "
        f"{describe_rollout_bytes(samples, 1 + tokens)}, more than the "
        f"{memory / GIB:.1f} GiB a worker holds (RLWB_HOST_MEMORY)"
    ]


def train_size_problems(tokens: int, samples: int, steps: int) -> list[str]:
    """What is too large in a train job of ``samples`` (prompts x group) per step of
    ``tokens`` new tokens each, for ``steps`` steps."""
    problems = _new_tokens_problems(tokens)
    if samples * tokens > _limit("RLWB_MAX_STEP_TOKENS"):
        problems.append(
            f"batch_size x group_size x max_tokens = {samples * tokens} > "
            f"{_limit('RLWB_MAX_STEP_TOKENS')} tokens per step"
        )
    if steps > _limit("RLWB_MAX_STEPS"):
        problems.append(f"steps > {_limit('RLWB_MAX_STEPS')}")
    return problems + _footprint_problems(samples, tokens)


def eval_size_problems(tokens: int, prompts: int) -> list[str]:
    """What is too large in an evaluation of ``prompts`` prompts of ``tokens`` new tokens."""
    problems = _new_tokens_problems(tokens)
    if prompts > _limit("RLWB_MAX_EVAL_PROMPTS"):
        problems.append(f"num_prompts > {_limit('RLWB_MAX_EVAL_PROMPTS')}")
    return problems + _footprint_problems(prompts, tokens)
