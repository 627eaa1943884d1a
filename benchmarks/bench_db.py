"""Storage benchmark on SQLite and PostgreSQL: batch inserts, filtered pages, bytes per sample.

1. Insert ``--insert-samples`` samples of ``--tokens`` tokens (token ids, behaviour and
   temperature-only log-probs) through `Repository.record_batch`, ``--batch-size`` per batch
   (one transaction each). Target: 10,000 x 256 tokens in <= 5 s.
2. Storage per sample after step 1: SQLite file size (WAL checkpointed) or PostgreSQL
   ``pg_total_relation_size`` of the samples and batches tables (heap, TOAST and indexes),
   divided by the sample count.
3. Bulk-load ``--samples`` more samples into a second job (executemany on SQLite, COPY on
   PostgreSQL, indexes rebuilt after the load, then ANALYZE), and time
   `Repository.list_samples` pages of 50 under several filters: warm, median of
   ``--repeats``. Target: <= 100 ms for a filtered page out of 1,000,000 samples.

Each backend gets a fresh database (a temporary SQLite file; a PostgreSQL schema that is
dropped afterwards).

    .venv/bin/python benchmarks/bench_db.py                        # both backends, 1M rows
    .venv/bin/python benchmarks/bench_db.py --samples 100000 --backends sqlite
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from db import BatchRecord, PolicyVersionRecord, Repository, SampleFilter, SampleRecord, upgrade
from db.arrays import encode_float32, encode_int32
from db.models import RolloutBatch, Sample

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
GROUP_SIZE = 8
BULK_BATCH_SIZE = 64
BULK_VERSIONS = 200
ERROR_CODES = ("kv_exhausted", "non_finite_logits", "internal", "prompt_too_long")
WORDS = ("the", "answer", "is", "so", "we", "add", "then", "multiply", "and", "divide", "total")

# name -> filter fields (besides job_id); the first one is the headline "filtered page".
QUERIES: dict[str, dict[str, Any]] = {
    "versions 50-150, length, reward>=0.5": {
        "min_version": 50,
        "max_version": 150,
        "finish_reason": "length",
        "min_reward": 0.5,
    },
    "whole job": {},
    "versions 120-121": {"min_version": 120, "max_version": 121},
    "finish_reason=error": {"finish_reason": "error"},
    "error_code=prompt_too_long": {"error_code": "prompt_too_long"},
    "reward 0.95-1.0": {"min_reward": 0.95, "max_reward": 1.0},
    "rejected batches": {"batch_status": "rejected"},
    "text 'fraction'": {"text": "fraction"},
}


@dataclass
class Result:
    backend: str
    insert_s: float = 0.0
    bytes_per_sample: float = 0.0
    load_s: float = 0.0
    query_ms: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- data
def _float32s(rng: random.Random, count: int) -> list[float]:
    raw = struct.pack(f"<{count}f", *(-rng.expovariate(2.0) for _ in range(count)))
    return list(struct.unpack(f"<{count}f", raw))


def _response(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text + (" as a fraction" if rng.random() < 0.01 else "")


def insert_records(job_id: int, total: int, tokens: int, batch_size: int) -> list[BatchRecord]:
    """Accepted batches of GRPO groups, built before timing starts."""
    rng = random.Random(0)
    batches = []
    for start in range(0, total, batch_size):
        samples = [
            SampleRecord(
                prompt_index=i // GROUP_SIZE,
                group_index=i % GROUP_SIZE,
                policy_version=0,
                prompt_text=f"Problem {i // GROUP_SIZE}: what is {i} * 7 + 3?",
                prompt_messages=[{"role": "user", "content": f"What is {i} * 7 + 3?"}],
                reference_output=str(i * 7 + 3),
                response_text=_response(rng, 40),
                response_token_ids=[rng.randrange(151_000) for _ in range(tokens)],
                behaviour_logprobs=_float32s(rng, tokens),
                temperature_logprobs=_float32s(rng, tokens),
                finish_reason="stop",
                reward=float(rng.random() < 0.5),
                advantage=rng.uniform(-1, 1),
                cached_prompt_tokens=16,
                seed=i,
            )
            for i in range(start, min(start + batch_size, total))
        ]
        batches.append(BatchRecord(job_id, 0, start // batch_size, "accepted", samples))
    return batches


def bulk_rows(
    job_id: int, first_batch_id: int, total: int, tokens: int
) -> tuple[list[dict[str, Any]], Iterator[tuple]]:
    """Batches (5% rejected, with 1-3 errored samples each) and a stream of sample rows
    with the columns of `SAMPLE_COLUMNS`."""
    rng = random.Random(1)
    now = datetime.now(UTC)
    # Pools of distinct arrays and texts: generating a million of each would dominate.
    arrays = [
        (
            encode_int32([rng.randrange(151_000) for _ in range(tokens)]),
            encode_float32(_float32s(rng, tokens)),
            encode_float32(_float32s(rng, tokens)),
        )
        for _ in range(64)
    ]
    responses = [_response(rng, 40) for _ in range(4096)]
    batches, plan = [], []
    per_version = max(1, total // BULK_VERSIONS)
    for index, start in enumerate(range(0, total, BULK_BATCH_SIZE)):
        size = min(BULK_BATCH_SIZE, total - start)
        version = min(start // per_version, BULK_VERSIONS - 1)
        rejected = rng.random() < 0.05
        failed = set(rng.sample(range(size), rng.randint(1, 3))) if rejected else set()
        batches.append(
            {
                "id": first_batch_id + index,
                "job_id": job_id,
                "policy_version": version,
                "step": index,
                "status": "rejected" if rejected else "accepted",
                "rejection_reasons": ["errored response"] if rejected else [],
                "num_samples": size,
                "created_at": now,
            }
        )
        plan.append((first_batch_id + index, version, start, size, failed))

    def rows() -> Iterator[tuple]:
        for batch_id, version, start, size, failed in plan:
            for offset in range(size):
                i = start + offset
                ids, behaviour, temperature = arrays[i % len(arrays)]
                if offset in failed:
                    finish = rng.choice(("error", "abort"))
                    code = rng.choice(ERROR_CODES) if finish == "error" else "cancelled"
                    yield (
                        batch_id, job_id, version, i // GROUP_SIZE, i % GROUP_SIZE, finish,
                        code, None, None, 0, 0, i, f"Problem {i // GROUP_SIZE}", "",
                        f"{code} at token 0", None, None, b"", b"", None,
                    )  # fmt: skip
                    continue
                finish = "length" if rng.random() < 0.15 else "stop"
                yield (
                    batch_id, job_id, version, i // GROUP_SIZE, i % GROUP_SIZE, finish,
                    None, round(rng.random(), 3), rng.uniform(-1, 1), tokens, 16, i,
                    f"Problem {i // GROUP_SIZE}: what is {i} * 7 + 3?", rng.choice(responses),
                    None, str(i * 7 + 3), None, ids, behaviour, temperature,
                )  # fmt: skip

    return batches, rows()


SAMPLE_COLUMNS = (
    "batch_id", "job_id", "policy_version", "prompt_index", "group_index", "finish_reason",
    "error_code", "reward", "advantage", "response_length", "cached_prompt_tokens", "seed",
    "prompt_text", "response_text", "error_message", "reference_output", "prompt_messages",
    "response_token_ids", "behaviour_logprobs", "temperature_logprobs",
)  # fmt: skip


# ------------------------------------------------------------------------------ backends
class Backend:
    name: str
    url: sa.URL

    def storage_bytes(self, engine: sa.Engine) -> int:
        raise NotImplementedError

    def bulk_insert_samples(self, engine: sa.Engine, rows: Iterator[tuple]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Remove the benchmark database."""


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self) -> None:
        self.directory = tempfile.TemporaryDirectory(prefix="bench_db_")
        self.path = Path(self.directory.name) / "bench.db"
        self.url = sa.URL.create("sqlite+pysqlite", database=str(self.path))

    def storage_bytes(self, engine: sa.Engine) -> int:
        with engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        return self.path.stat().st_size

    def bulk_insert_samples(self, engine: sa.Engine, rows: Iterator[tuple]) -> None:
        placeholders = ", ".join("?" * len(SAMPLE_COLUMNS))
        statement = f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({placeholders})"
        with engine.begin() as connection:
            connection.connection.driver_connection.executemany(statement, rows)

    def close(self) -> None:
        self.directory.cleanup()


class PostgresBackend(Backend):
    name = "postgresql"

    def __init__(self, url: str) -> None:
        self.admin = sa.create_engine(url)
        self.schema = f"rlwb_bench_{secrets.token_hex(4)}"
        with self.admin.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{self.schema}"')
        self.url = sa.make_url(url).update_query_dict({"options": f"-csearch_path={self.schema}"})

    def storage_bytes(self, engine: sa.Engine) -> int:
        with engine.connect() as connection:
            return connection.exec_driver_sql(
                "SELECT pg_total_relation_size('samples')"
                " + pg_total_relation_size('rollout_batches')"
            ).scalar()

    def bulk_insert_samples(self, engine: sa.Engine, rows: Iterator[tuple]) -> None:
        with engine.begin() as connection:
            cursor = connection.connection.driver_connection.cursor()
            with cursor.copy(f"COPY samples ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)

    def close(self) -> None:
        with self.admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{self.schema}" CASCADE')
        self.admin.dispose()


# ------------------------------------------------------------------------------- phases
def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def insert_phase(repo: Repository, backend: Backend, args: argparse.Namespace) -> Result:
    job = repo.create_job("train", {"benchmark": "insert"})
    repo.mark_running(job.id)
    repo.record_policy_version(PolicyVersionRecord(job.id, 0))
    batches = insert_records(job.id, args.insert_samples, args.tokens, args.batch_size)
    result = Result(backend.name)
    result.insert_s = timed(lambda: [repo.record_batch(batch) for batch in batches])
    result.bytes_per_sample = backend.storage_bytes(repo.engine) / args.insert_samples
    return result


def bulk_load(repo: Repository, backend: Backend, args: argparse.Namespace) -> int:
    job = repo.create_job("train", {"benchmark": "bulk"})
    repo.mark_running(job.id)
    with repo.engine.connect() as connection:
        first_batch_id = connection.scalar(sa.select(sa.func.max(RolloutBatch.id))) + 1
    batches, rows = bulk_rows(job.id, first_batch_id, args.samples, args.bulk_tokens)
    engine = repo.engine
    with engine.begin() as connection:
        for index in Sample.__table__.indexes:
            index.drop(connection)
        connection.execute(sa.insert(RolloutBatch.__table__), batches)
    backend.bulk_insert_samples(engine, rows)
    with engine.begin() as connection:
        for index in Sample.__table__.indexes:
            index.create(connection)
        connection.execute(  # the totals Repository.record_batch keeps up to date
            sa.text(
                "INSERT INTO version_sample_stats (job_id, policy_version, finish_reason,"
                " samples, rewarded, reward_sum, response_tokens) SELECT job_id, policy_version,"
                " finish_reason, count(*), count(reward), coalesce(sum(reward), 0),"
                " sum(response_length) FROM samples WHERE job_id = :job"
                " GROUP BY job_id, policy_version, finish_reason"
            ),
            {"job": job.id},
        )
        if engine.dialect.name == "postgresql":
            connection.exec_driver_sql(
                "SELECT setval(pg_get_serial_sequence('rollout_batches', 'id'), max(id)) "
                "FROM rollout_batches"
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("ANALYZE")
    return job.id


def median_ms(call: Callable[[], Any], repeats: int) -> float:
    call()  # warm
    return statistics.median(timed(call) for _ in range(repeats)) * 1000


def query_phase(repo: Repository, job_id: int, result: Result, repeats: int) -> None:
    """Median milliseconds per call, keyed by a label for the report."""
    for name, fields in QUERIES.items():
        where = SampleFilter(job_id, **fields)
        assert repo.list_samples(where).items, f"{name}: no match"
        result.query_ms[f"page of 50: {name}"] = median_ms(
            lambda where=where: repo.list_samples(where), repeats
        )
    headline = SampleFilter(job_id, **next(iter(QUERIES.values())))
    cursor = repo.list_samples(headline, limit=1000).next_cursor
    result.query_ms["page 21 of the first filter (keyset cursor)"] = median_ms(
        lambda: repo.list_samples(headline, cursor=cursor), repeats
    )
    batch = repo.list_batches(job_id, status="rejected", limit=1)[0]
    one_batch = SampleFilter(job_id, batch_id=batch.id)
    result.query_ms["page of 50: one batch (batch_id)"] = median_ms(
        lambda: repo.list_samples(one_batch), repeats
    )
    result.query_ms["list_batches, newest 200"] = median_ms(
        lambda: repo.list_batches(job_id, limit=200, newest_first=True), repeats
    )
    sample_id = repo.list_samples(SampleFilter(job_id)).items[-1].id
    result.query_ms["get_sample (with arrays)"] = median_ms(
        lambda: repo.get_sample(sample_id), repeats
    )
    result.query_ms["compare_versions, 20 prompts"] = median_ms(
        lambda: repo.compare_versions(job_id, 10, 190, match_on="prompt_index"), repeats
    )
    result.query_ms["version_metrics over the whole job"] = median_ms(
        lambda: repo.version_metrics(job_id), max(1, repeats // 3)
    )


def run(backend: Backend, args: argparse.Namespace) -> Result:
    try:
        upgrade(backend.url)
        repo = Repository.from_url(backend.url)
        result = insert_phase(repo, backend, args)
        print(f"[{backend.name}] inserted {args.insert_samples} samples in {result.insert_s:.2f} s")
        start = time.perf_counter()
        job_id = bulk_load(repo, backend, args)
        result.load_s = time.perf_counter() - start
        print(f"[{backend.name}] bulk-loaded {args.samples} samples in {result.load_s:.1f} s")
        query_phase(repo, job_id, result, args.repeats)
        repo.close()
        return result
    finally:
        backend.close()


def report(results: list[Result], args: argparse.Namespace) -> None:
    rows = [
        (f"insert {args.insert_samples} x {args.tokens} tokens (s, target <= 5)", "insert_s"),
        ("storage per sample (bytes)", "bytes_per_sample"),
        (f"bulk load {args.samples} x {args.bulk_tokens} tokens (s)", "load_s"),
    ]
    rows += [
        (f"{name} (ms{', target <= 100' if name.startswith('page') else ''})", name)
        for name in results[0].query_ms
    ]
    width = max(len(label) for label, _ in rows) + 2
    print("\n" + "".ljust(width) + "".join(r.backend.rjust(12) for r in results))
    for label, key in rows:
        values = [r.query_ms[key] if key in r.query_ms else getattr(r, key) for r in results]
        print(label.ljust(width) + "".join(f"{value:12.1f}" for value in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--insert-samples", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256, help="samples per batch insert")
    parser.add_argument("--samples", type=int, default=1_000_000, help="bulk-loaded samples")
    parser.add_argument("--bulk-tokens", type=int, default=256, help="tokens per bulk sample")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    results = []
    for name in args.backends:
        backend = SQLiteBackend() if name == "sqlite" else PostgresBackend(args.postgres_url)
        results.append(run(backend, args))
    report(results, args)


if __name__ == "__main__":
    main()
