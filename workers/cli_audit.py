"""``rlwb audit JOB [--samples N]``: re-score a random sample of a job's stored samples under
their stamped versions' kept weights, here (see `workers.scoring`), and say whether each
reproduces its stored log-probs within the tolerance."""

import argparse
import os
from collections import Counter
from typing import Any

DEFAULT_SAMPLES = 20


def add_command(commands: argparse._SubParsersAction) -> None:
    audit = commands.add_parser(
        "audit",
        help="re-score stored samples under their versions' kept weights (attribution check)",
        description="Draw N stored samples of JOB at random across its versions, recompute "
        "their log-probs under the stamped version's kept weights and report the largest "
        "|stored - recomputed| per sample against the tolerance. Exit status 1 if any fails.",
    )
    audit.add_argument("job_id", type=int)
    audit.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="how many (max 200)")


def _line(result: dict[str, Any]) -> str:
    diff = result.get("max_abs_diff")
    shown = "-" if diff is None else f"{diff:.3g}"
    where = f"v{result['version']}" if "version" in result else "-"
    line = (
        f"sample {result['sample_id']:>8}  {where:<6} {result.get('tokens', 0):>5} tokens  "
        f"max |stored - recomputed| {shown:<9} {result['status']}"
    )
    return line + (f"  ({result['problem']})" if result.get("problem") else "")


def run(args: argparse.Namespace) -> int:
    """Audit and print one line per sample and a summary; 1 if a sample failed or erred."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from db import NotFound, StorageError
    from workers.scoring import AUDIT_TOLERANCE, MAX_AUDIT_SAMPLES, audit_samples
    from workers.settings import Settings
    from workers.storage import repository

    if not 1 <= args.samples <= MAX_AUDIT_SAMPLES:
        print(f"refused: --samples must be from 1 to {MAX_AUDIT_SAMPLES}")
        return 1
    repo = repository()
    try:
        ids = repo.random_sample_ids(args.job_id, args.samples)
    except (NotFound, StorageError) as exc:
        print(f"refused: {exc}")
        return 1
    if not ids:
        print(f"job {args.job_id} has no stored samples with a response")
        return 1
    results = audit_samples(repo, Settings.from_env(), ids)["samples"]
    for result in results:
        print(_line(result), flush=True)
    counts = Counter(result["status"] for result in results)
    print(
        f"{len(results)} samples: "
        + ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
        + f" (tolerance {AUDIT_TOLERANCE:g} per token, fp32)"
    )
    return 1 if counts["fail"] or counts["error"] else 0
