import struct
from array import array

import pytest
import sqlalchemy as sa

from db import (
    BatchNotFound,
    BatchStatus,
    FinishReason,
    InvalidTransition,
    InvalidValue,
    JobNotFound,
    Repository,
    SampleFilter,
)
from db.models import RolloutBatch, Sample

from .helpers import make_batch, make_sample, running_job


def _f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _count(repo: Repository, model: type) -> int:
    with repo.engine.connect() as connection:
        return connection.scalar(sa.select(sa.func.count()).select_from(model))


def test_sample_round_trips_exactly(repo: Repository) -> None:
    job = running_job(repo, versions=2)
    token_ids = [0, 1, 2**31 - 1, 151_643, 7]
    behaviour = [_f32(v) for v in (-0.1, -2.5e-8, -13.75, 0.0, -1e-40)]
    temperature = [_f32(v) for v in (-0.2, -3e-8, -12.0, -0.0, -2e-40)]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2? ünïcödé ✓"},
    ]
    record = make_sample(
        3,
        2,
        version=1,
        prompt_text="2+2? ünïcödé ✓",
        prompt_messages=messages,
        reference_output="4",
        response_text="4<|im_end|>",
        response_token_ids=token_ids,
        behaviour_logprobs=behaviour,
        temperature_logprobs=temperature,
        reward=1.0,
        advantage=-0.7071067811865476,
        cached_prompt_tokens=16,
        seed=2**40 + 3,
    )
    batch = repo.record_batch(make_batch(job.id, [record], version=1, step=4))
    (summary,) = repo.list_samples(SampleFilter(job.id)).items
    stored = repo.get_sample(summary.id)
    assert stored.response_token_ids == token_ids
    assert stored.behaviour_logprobs == behaviour
    assert [struct.pack("<f", v) for v in stored.temperature_logprobs] == [
        struct.pack("<f", v) for v in temperature
    ]  # -0.0 stays -0.0
    assert stored.prompt_messages == messages
    assert (stored.prompt_text, stored.reference_output) == (record.prompt_text, "4")
    assert stored.response_text == "4<|im_end|>"
    assert (stored.reward, stored.advantage) == (1.0, -0.7071067811865476)
    assert (stored.cached_prompt_tokens, stored.seed) == (16, 2**40 + 3)
    assert (stored.prompt_index, stored.group_index, stored.policy_version) == (3, 2, 1)
    assert stored.finish_reason is FinishReason.STOP
    assert (stored.error_code, stored.error_message) == (None, None)
    assert (stored.batch_id, stored.batch_status, stored.job_id) == (
        batch.id,
        BatchStatus.ACCEPTED,
        job.id,
    )
    assert summary.response_length == 5


def test_arrays_are_stored_as_little_endian_binary(repo: Repository) -> None:
    job = running_job(repo)
    repo.record_batch(make_batch(job.id, [make_sample(response_token_ids=[1, 256, -1, 2])]))
    with repo.engine.connect() as connection:
        raw = connection.execute(sa.text("SELECT response_token_ids FROM samples")).scalar()
    assert bytes(raw) == struct.pack("<4i", 1, 256, -1, 2)


def test_rejected_batch_keeps_errored_samples_and_reasons(repo: Repository) -> None:
    job = running_job(repo)
    errored = make_sample(
        0,
        1,
        response_text="",
        response_token_ids=[],
        behaviour_logprobs=[],
        temperature_logprobs=None,
        finish_reason="error",
        error_code="kv_exhausted",
        error_message="no free KV pages for 512 tokens",
        reward=None,
        advantage=None,
    )
    batch = repo.record_batch(
        make_batch(
            job.id,
            [make_sample(0, 0), errored],
            step=3,
            status="rejected",
            reasons=("errored response: kv_exhausted", "empty response"),
        )
    )
    assert batch.status is BatchStatus.REJECTED
    assert batch.rejection_reasons == ["errored response: kv_exhausted", "empty response"]
    assert (batch.num_samples, batch.step, batch.policy_version) == (2, 3, 0)
    assert repo.list_batches(job.id) == [batch]
    page = repo.list_samples(SampleFilter(job.id, error_code="kv_exhausted"))
    (stored,) = page.items
    detail = repo.get_sample(stored.id)
    assert detail.error_message == "no free KV pages for 512 tokens"
    assert (detail.response_token_ids, detail.temperature_logprobs) == ([], None)


def test_list_batches_in_order_with_status_filter(repo: Repository) -> None:
    job = running_job(repo)
    first = repo.record_batch(make_batch(job.id, [make_sample()], step=0))
    rejected = repo.record_batch(
        make_batch(job.id, [make_sample()], step=1, status="rejected", reasons=("nan reward",))
    )
    third = repo.record_batch(make_batch(job.id, [make_sample()], step=1))
    assert repo.list_batches(job.id) == [first, rejected, third]
    assert repo.list_batches(job.id, status="rejected") == [rejected]
    assert repo.list_batches(job.id, status=BatchStatus.ACCEPTED) == [first, third]
    with pytest.raises(InvalidValue, match="status: 'filtered'"):
        repo.list_batches(job.id, status="filtered")
    with pytest.raises(JobNotFound):
        repo.list_batches(job.id + 100)


def test_list_batches_newest_first_with_a_limit(repo: Repository) -> None:
    job = running_job(repo)
    batches = [
        repo.record_batch(make_batch(job.id, [make_sample()], step=step, **rejected))
        for step, rejected in enumerate([{}, {"status": "rejected", "reasons": ("x",)}, {}, {}, {}])
    ]
    assert repo.list_batches(job.id, limit=2) == batches[:2]
    assert repo.list_batches(job.id, newest_first=True) == batches[::-1]
    assert repo.list_batches(job.id, limit=3, newest_first=True) == batches[:1:-1]
    assert repo.list_batches(job.id, status="accepted", limit=1, newest_first=True) == [batches[4]]
    assert repo.list_batches(job.id, status="rejected", limit=5) == [batches[1]]
    for limit in (0, -1, 1001):
        with pytest.raises(InvalidValue, match=f"limit: {limit} is outside 1..1000"):
            repo.list_batches(job.id, limit=limit)


def test_get_batch(repo: Repository) -> None:
    job = running_job(repo)
    accepted = repo.record_batch(make_batch(job.id, [make_sample()], step=0))
    rejected = repo.record_batch(
        make_batch(
            job.id,
            [make_sample(), make_sample(0, 1)],
            step=1,
            status="rejected",
            reasons=("nan reward",),
        )
    )
    assert repo.get_batch(accepted.id) == accepted
    assert repo.get_batch(rejected.id) == rejected
    assert (rejected.num_samples, rejected.rejection_reasons) == (2, ["nan reward"])
    with pytest.raises(BatchNotFound, match=f"batch {rejected.id + 1} does not exist") as raised:
        repo.get_batch(rejected.id + 1)
    assert raised.value.batch_id == rejected.id + 1


INVALID_BATCHES = [
    ({"status": "maybe"}, {}, "status: 'maybe' is not one of accepted, rejected"),
    ({"status": "rejected"}, {}, "a rejected batch needs at least one rejection reason"),
    ({"reasons": ("why",)}, {}, "an accepted batch has no rejection reasons"),
    ({"reasons": ("",), "status": "rejected"}, {}, "each reason must be a non-empty string"),
    ({"step": -1}, {}, "step: -1 is negative"),
    ({}, {"finish_reason": "eos"}, r"samples\[1\].finish_reason: 'eos' is not one of"),
    ({}, {"finish_reason": "error"}, r"samples\[1\]: finish_reason 'error' requires an error_code"),
    ({}, {"error_code": "internal"}, "finish_reason 'stop' must not have an error_code"),
    ({}, {"behaviour_logprobs": [-1.0]}, "behaviour_logprobs: 1 values for 4 response tokens"),
    ({}, {"temperature_logprobs": [0.0] * 5}, "temperature_logprobs: 5 values for 4"),
    ({}, {"response_token_ids": [1, 2, 3, 2**31]}, "response_token_ids: .*int32"),
    ({}, {"behaviour_logprobs": ["a"] * 4}, "behaviour_logprobs: .*float32"),
    ({}, {"reward": float("nan")}, r"samples\[1\].reward: nan is not finite"),
    ({}, {"advantage": float("-inf")}, "advantage: -inf is not finite"),
    ({}, {"version": 1}, "policy_version: 1 is outside 0..0"),
    ({}, {"cached_prompt_tokens": -3}, "cached_prompt_tokens: -3 is negative"),
    ({}, {"prompt_text": None}, "prompt_text: expected a string"),
    ({}, {"prompt_messages": [{"x": float("nan")}]}, "prompt_messages: not storable as JSON"),
    ({}, {"finish_reason": "abort", "error_code": "cancelled"}, "accepted batch cannot contain"),
    ({}, {"tokens": 0, "response_text": ""}, "accepted batch cannot contain an empty response"),
    ({}, {"reward": None}, "accepted batch cannot contain no reward"),
]


@pytest.mark.parametrize(("batch_fields", "sample_fields", "match"), INVALID_BATCHES)
def test_invalid_sample_in_the_middle_stores_nothing(
    repo: Repository, batch_fields: dict, sample_fields: dict, match: str
) -> None:
    job = running_job(repo)
    samples = [make_sample(0, 0), make_sample(0, 1, **sample_fields), make_sample(0, 2)]
    with pytest.raises(InvalidValue, match=match):
        repo.record_batch(make_batch(job.id, samples, **batch_fields))
    assert (_count(repo, RolloutBatch), _count(repo, Sample)) == (0, 0)


def test_empty_batch_is_refused(repo: Repository) -> None:
    job = running_job(repo)
    with pytest.raises(InvalidValue, match="at least one sample"):
        repo.record_batch(make_batch(job.id, []))


def test_failure_part_way_through_the_write_leaves_nothing(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch row is inserted, then inserting its samples fails: all of it rolls back."""
    job = running_job(repo)
    repo.record_batch(make_batch(job.id, [make_sample()]))
    statements: list[str] = []

    def fail_on_samples(connection, cursor, statement, parameters, context, executemany):
        statements.append(statement)
        if statement.lstrip().upper().startswith("INSERT INTO SAMPLES"):
            raise RuntimeError("disk full")

    sa.event.listen(repo.engine, "before_cursor_execute", fail_on_samples)
    with pytest.raises(RuntimeError, match="disk full"):
        repo.record_batch(make_batch(job.id, [make_sample(0, g) for g in range(50)], step=1))
    sa.event.remove(repo.engine, "before_cursor_execute", fail_on_samples)

    assert any(s.lstrip().upper().startswith("INSERT INTO ROLLOUT_BATCHES") for s in statements)
    assert (_count(repo, RolloutBatch), _count(repo, Sample)) == (1, 1)
    assert [b.step for b in repo.list_batches(job.id)] == [0]
    repo.record_batch(make_batch(job.id, [make_sample()], step=1))  # the database is usable
    assert _count(repo, Sample) == 2


@pytest.mark.parametrize(
    ("column", "value"),
    [("finish_reason", "'eos'"), ("error_code", "'internal'"), ("cached_prompt_tokens", "-1")],
)
def test_schema_constraints_back_up_validation(repo: Repository, column: str, value: str) -> None:
    """Rows written around the repository still cannot break the invariants."""
    job = running_job(repo)
    batch = repo.record_batch(make_batch(job.id, [make_sample()]))
    values = {
        "batch_id": str(batch.id),
        "job_id": str(job.id),
        "policy_version": "0",
        "prompt_index": "0",
        "group_index": "0",
        "finish_reason": "'stop'",
        "response_length": "0",
        "cached_prompt_tokens": "0",
        "prompt_text": "''",
        "response_text": "''",
        "response_token_ids": "X''" if repo.engine.dialect.name == "sqlite" else "''::bytea",
        "behaviour_logprobs": "X''" if repo.engine.dialect.name == "sqlite" else "''::bytea",
    }

    def insert(values: dict[str, str]) -> None:
        with repo.engine.begin() as connection:
            connection.exec_driver_sql(
                f"INSERT INTO samples ({', '.join(values)}) VALUES ({', '.join(values.values())})"
            )

    insert(values)  # valid as it is
    with pytest.raises(sa.exc.IntegrityError):
        insert({**values, column: value})
    assert _count(repo, Sample) == 2


def test_batches_for_unknown_or_inactive_jobs_are_refused(repo: Repository) -> None:
    with pytest.raises(JobNotFound):
        repo.record_batch(make_batch(424242, [make_sample()]))
    queued = repo.create_job("train", {})
    with pytest.raises(InvalidTransition, match="'queued': cannot record a rollout batch"):
        repo.record_batch(make_batch(queued.id, [make_sample()]))
    assert _count(repo, RolloutBatch) == 0


def test_cancelling_job_may_still_store_its_last_batch(repo: Repository) -> None:
    job = running_job(repo)
    repo.request_cancel(job.id)
    batch = repo.record_batch(
        make_batch(job.id, [make_sample()], status="rejected", reasons=("cancelled",))
    )
    assert repo.list_batches(job.id) == [batch]


def test_arrays_may_be_any_sequence_of_numbers(repo: Repository) -> None:
    job = running_job(repo)
    record = make_sample(
        response_token_ids=(5, 6, 7),
        behaviour_logprobs=array("f", [-1.0, -2.0, -3.0]),
        temperature_logprobs=(-0.5, -1.5, -2.5),
    )
    repo.record_batch(make_batch(job.id, [record]))
    (summary,) = repo.list_samples(SampleFilter(job.id)).items
    stored = repo.get_sample(summary.id)
    assert stored.response_token_ids == [5, 6, 7]
    assert stored.behaviour_logprobs == [-1.0, -2.0, -3.0]
    assert stored.temperature_logprobs == [-0.5, -1.5, -2.5]
