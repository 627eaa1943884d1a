"""Conversions from trainer results to storage records."""

import math
from dataclasses import replace

from core_engine.rl.rollout import RolloutResult
from core_engine.rl.trainer.records import StepRecord, VersionRecord
from core_engine.task import ErrorCode, TaskError
from db import BatchStatus
from db.repository.batch_rows import check_batch
from workers.records import policy_metrics, sample_records, trainer_batches


def rollout(errors=(None, None, None, None), response_ids=((5,), (6,), (7,), (8,))):
    """2 prompts x 2 samples; sample 2 can be made to fail."""
    return RolloutResult(
        prompts=["p0", "p1"],
        messages=[[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
        references=["r0", "r1"],
        prompt_ids=[[1], [2]],
        response_ids=[list(ids) for ids in response_ids],
        completions=["x", "y", "z", "w"],
        behaviour_logprobs=[[-0.5] * len(ids) for ids in response_ids],
        temp_logprobs=[[-0.4] * len(ids) for ids in response_ids],
        finish_reasons=["stop" if e is None else "error" for e in errors],
        errors=list(errors),
        cached_prompt_tokens=[0, 1, 0, 1],
        seeds=[10, 11, 12, 13],
        policy_version=3,
        group_size=2,
        temperature=1.0,
        rewards=[1.0, 0.0, 1.0, 0.0],
    )


def test_samples_are_indexed_by_prompt_and_group_position():
    records = sample_records(rollout(), [1.0, 0.0, 1.0, math.nan], [0.5, -0.5, 0.5, -0.5])
    assert [(r.prompt_index, r.group_index) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r.prompt_text for r in records] == ["p0", "p0", "p1", "p1"]
    assert records[2].reference_output == "r1" and records[2].seed == 12
    assert records[3].reward is None  # not finite: stored as missing, never as NaN
    assert records[1].cached_prompt_tokens == 1 and records[0].policy_version == 3


def test_a_group_rejection_inside_an_accepted_batch_is_stored_as_its_own_rejected_batch():
    failed = TaskError(ErrorCode.KV_EXHAUSTED, "no pages")
    batch = StepRecord(
        step=3,
        rollout=rollout(errors=(None, None, failed, None)),
        version=VersionRecord(4, 3, "c" * 64, {}),
        reasons=["sample 2: error/kv_exhausted: no pages"],
        rejected_groups={1: "sample 2: error/kv_exhausted: no pages"},
        advantages=[1.0, -1.0, 0.0, 0.0],
    )
    accepted, rejected = trainer_batches(7, 3, batch)
    assert accepted.status is BatchStatus.ACCEPTED and not accepted.rejection_reasons
    assert [s.prompt_index for s in accepted.samples] == [0, 0]
    assert [s.advantage for s in accepted.samples] == [1.0, -1.0]
    assert rejected.status is BatchStatus.REJECTED and rejected.step == 3
    assert rejected.rejection_reasons == ["sample 2: error/kv_exhausted: no pages"]
    assert [s.error_code for s in rejected.samples] == ["kv_exhausted", None]
    assert all(s.advantage is None for s in rejected.samples)


def test_a_rejected_batch_keeps_its_samples_and_reasons_and_one_without_rollout_is_dropped():
    batch = StepRecord(3, rollout(), None, ["reward function raised"])
    [stored] = trainer_batches(7, 3, batch)
    assert stored.status is BatchStatus.REJECTED and len(stored.samples) == 4
    assert stored.rejection_reasons == ["reward function raised"]
    assert trainer_batches(7, 3, StepRecord(3, None, None, ["stale"])) == []


def test_policy_metrics_name_the_known_ones_and_keep_the_rest_as_extra():
    metrics = policy_metrics(
        {
            "reward_mean": 0.5,
            "loss": 0.1,
            "mismatch_max": 1e-5,
            "tokens_per_s": 100.0,
            "clip_fraction": 0.2,
            "kl": math.inf,
        },
        1,
        2,
    )
    assert metrics.reward_mean == 0.5 and metrics.train_infer_mismatch == 1e-5
    assert metrics.tokens_per_second == 100.0 and metrics.kl is None
    assert metrics.extra == {"clip_fraction": 0.2}
    assert (metrics.num_accepted, metrics.num_rejected) == (1, 2)


def test_in_flight_samples_are_stamped_with_their_oldest_token_and_keep_their_runs():
    """A weight update landed while samples 1 and 3 were generated; the batch's version is the
    trainer's, never older than any token's."""
    runs = [[[2, 1]], [[2, 1], [3, 1]], [[3, 1]], [[1, 2], [3, 1]]]
    ids = ((5,), (6, 6), (7,), (8, 8, 8))
    result = replace(rollout(response_ids=ids), policy_version=1, token_versions=runs)
    records = sample_records(result)
    assert [r.policy_version for r in records] == [2, 2, 3, 1]
    assert [r.token_versions for r in records] == [None, [[2, 1], [3, 1]], None, [[1, 2], [3, 1]]]
    [stored] = trainer_batches(7, 3, StepRecord(0, result, None, ["rejected for the test"]))
    assert stored.policy_version == 3
    check_batch(stored)  # storable: each sample's runs start at its version, none after 3
    assert [r.token_versions for r in sample_records(rollout())] == [None] * 4  # old rollouts


def test_each_sample_keeps_the_rank_that_generated_it_and_one_rank_is_rank_0():
    """A job over two devices (issue 31): each rank generated one group; the records, split
    into the accepted and the rejected batch, keep each sample's rank; a one-rank rollout (no
    ranks listed) stores 0, never None (None: stored before ranks were recorded)."""
    two = replace(rollout(), ranks=[0, 0, 1, 1])
    step = StepRecord(
        step=3,
        rollout=two,
        version=VersionRecord(4, 3, "c" * 64, {}),
        reasons=["prompt 0: no reward variance"],
        rejected_groups={0: "no reward variance"},
        advantages=[0.0, 0.0, 1.0, -1.0],
    )
    accepted, rejected = trainer_batches(7, 3, step)
    assert [s.rank for s in accepted.samples] == [1, 1]
    assert [s.rank for s in rejected.samples] == [0, 0]
    check_batch(accepted)
    assert [r.rank for r in sample_records(rollout())] == [0] * 4
    [stored] = trainer_batches(7, 3, StepRecord(0, rollout(), None, ["rejected for the test"]))
    assert [s.rank for s in stored.samples] == [0] * 4
