"""Whether GRPO gives bit-identical results in two checkouts, synchronous and `one_step`: the
check a refactor of the RL core must pass ("`sync` and `one_step` results are bit-identical to
today's", where the change does not change the rule).

Each checkout (this one and `--before`, e.g. `git worktree add /tmp/before <commit>`) trains
the same variants in a process of its own, from the same policy (this checkout's shipped demo
policy) and seed, through `GRPOTrainer.train()`; a variant is identical when the final weights,
every step's version, rewards and trainer log-probs, and every metric both checkouts record
(timings left out) are equal bit for bit. Metrics only one of them records are listed, not
compared. Not a speed measurement: quiet or busy machine alike.

    git worktree add /tmp/before <commit>
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sync_identity.py --before /tmp/before

`--pipeline one_step`: the same variants trained by the `one_step` pipeline (lag 1, one update
per batch, as the mode requires) in both checkouts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]

# GRPOConfig settings per variant, on top of BASE; the learning rate is explicit, as defaults
# may change between checkouts by design (LoRA's did)
BASE = {"task": "addition", "steps": 8, "batch_size": 8, "group_size": 4, "max_tokens": 6}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"lr": 3e-4},
    "kl + rollout reuse": {
        "lr": 3e-4,
        "kl_coef": 0.05,
        "updates_per_batch": 2,
        "max_policy_lag": 1,
    },
    "lora + kl": {"lr": 3e-3, "kl_coef": 0.05, "lora": {"rank": 4, "alpha": 8.0}},
    "micro-batches": {"lr": 3e-4, "max_tokens_per_micro_batch": 64, "logit_chunk_rows": 7},
    "group rejection": {
        "lr": 3e-4,
        "reject_scope": "group",
        "drop_zero_variance_groups": False,
        "weight_decay": 0.01,
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="the other checkout's root")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--pipeline", choices=("sync", "one_step"), default="sync")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # a child: this root
    parser.add_argument("--policy", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def pipelined(settings: dict[str, Any], pipeline: str) -> dict[str, Any]:
    """A variant's settings under `pipeline`: `one_step` trains at lag 1, one update a batch."""
    if pipeline == "sync":
        return dict(settings)
    lag = max(settings.get("max_policy_lag", 0), 1)
    return {**settings, "pipeline": pipeline, "max_policy_lag": lag, "updates_per_batch": 1}


def run_variants(root: Path, policy: Path, seed: int, pipeline: str) -> dict[str, Any]:
    """Train every variant with `root`'s code; per variant the weights' digest and the steps."""
    sys.path.insert(0, str(root))
    import torch

    import core_engine
    from core_engine.lora_settings import LoraSettings
    from core_engine.rl.config import GRPOConfig

    if not Path(core_engine.__file__).is_relative_to(root):
        raise SystemExit(f"{root}: imported core_engine from {core_engine.__file__}")
    try:
        from core_engine.rl.data.tasks import addition_records
        from core_engine.rl.trainer.grpo import GRPOTrainer
        from core_engine.rl.trainer.records import TrainerHooks
    except ImportError:  # the layout before the RL core was grouped by concept (issue 29)
        from core_engine.rl.records import TrainerHooks
        from core_engine.rl.tasks import addition_records

        from core_engine.rl.trainer import GRPOTrainer

    torch.set_num_threads(1)
    records = addition_records(2000, seed=1)
    results = {}
    for name, settings in VARIANTS.items():
        settings = pipelined(settings, pipeline)
        if "lora" in settings:
            settings["lora"] = LoraSettings(**settings["lora"])
        steps: list[dict[str, Any]] = []

        def on_step(record: Any, steps: list = steps) -> None:
            steps.append(
                {
                    "version": record.version.version if record.version else None,
                    "rewards": record.rollout.rewards if record.rollout else None,
                    "trainer_logprobs": record.trainer_logprobs,
                    "metrics": {k: v for k, v in record.metrics.items() if not k.endswith("_s")},
                }
            )

        with tempfile.TemporaryDirectory() as tmp:
            config = GRPOConfig(
                model=str(policy), output_dir=tmp, seed=seed, resume=False, **BASE, **settings
            )
            trainer = GRPOTrainer(config, records, TrainerHooks(on_step=on_step))
            trainer.train()
        # hashed here, not by the checkout's `weights_checksum`, which may differ between them
        digest = hashlib.sha256()
        for key, tensor in sorted(trainer.model.state_dict().items()):
            digest.update(key.encode())
            digest.update(tensor.detach().float().contiguous().numpy().tobytes())
        results[name] = {"weights": digest.hexdigest(), "steps": steps}
    return results


def differences(before: dict[str, Any], after: dict[str, Any]) -> tuple[list[str], set[str]]:
    """Where two runs of one variant differ, and the metrics only one of them records."""
    problems = [] if before["weights"] == after["weights"] else ["final weights"]
    if len(before["steps"]) != len(after["steps"]):
        problems.append(f"{len(before['steps'])} vs {len(after['steps'])} steps")
    one_sided: set[str] = set()
    for index, (b, a) in enumerate(zip(before["steps"], after["steps"], strict=False)):
        for key in ("version", "rewards", "trainer_logprobs"):
            if b[key] != a[key]:
                problems.append(f"step {index}: {key}")
        shared = b["metrics"].keys() & a["metrics"].keys()
        one_sided |= b["metrics"].keys() ^ a["metrics"].keys()
        problems += [
            f"step {index}: {k}" for k in sorted(shared) if b["metrics"][k] != a["metrics"][k]
        ]
    return problems, one_sided


def child_run(root: Path, policy: Path, seed: int, pipeline: str) -> dict[str, Any]:
    """`run_variants` of `root` in a process of its own (its code alone imported)."""
    command = [sys.executable, __file__, "--run", root, "--policy", policy, "--seed", str(seed)]
    command += ["--pipeline", pipeline]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{root}: the run failed\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run is not None:
        print(json.dumps(run_variants(args.run.resolve(), args.policy, args.seed, args.pipeline)))
        return
    if args.before is None:
        raise SystemExit("--before: the root of the checkout to compare with")
    sys.path.insert(0, str(HERE))
    from core_engine.assets import SHIPPED_POLICY

    before = child_run(args.before.resolve(), SHIPPED_POLICY, args.seed, args.pipeline)
    after = child_run(HERE, SHIPPED_POLICY, args.seed, args.pipeline)
    identical = True
    for name in VARIANTS:
        problems, one_sided = differences(before[name], after[name])
        identical &= not problems
        verdict = "identical" if not problems else "DIFFERENT: " + ", ".join(problems[:6])
        steps = len(after[name]["steps"])
        print(f"{name:<20} {steps:>2} steps  {verdict}")
        if one_sided:
            print(f"{'':<20} recorded by one checkout only: {', '.join(sorted(one_sided))}")
    print(f"{args.pipeline} results {'bit-identical' if identical else 'differ'}")
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
