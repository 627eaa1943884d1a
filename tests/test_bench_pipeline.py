"""The pipeline benchmark's timed trainer (`bench_pipeline.Timed`, reused by `bench_vs_trl`):
its stop hook ends a slice at the deadline and never stops the trainer's set-up, which asks the
same hook while it renders the prompts."""

import argparse

from benchmarks.bench_pipeline import VARIANTS, Timed
from core_engine.policies.demo import SHIPPED_POLICY
from core_engine.rl.data.tasks import addition_records


def test_a_timed_trainer_builds_and_a_slice_stops_at_its_deadline(tmp_path):
    args = argparse.Namespace(seed=0, eval_every=10**9, wide=False)
    timed = Timed(VARIANTS[0], addition_records(64, seed=0), args, tmp_path, SHIPPED_POLICY)
    assert timed.trainer.version == 0
    timed.run_slice(0.0)  # due at once: stopped at the first check between steps
    assert timed.trainer.version <= 1
    assert not timed._between()  # outside a slice nothing stops
