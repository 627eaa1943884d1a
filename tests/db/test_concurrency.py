"""A worker writing batches while UI threads read and one asks for cancellation."""

import threading
import time

from db import JobStatus, PolicyVersionRecord, Repository, SampleFilter

from .helpers import make_batch, make_sample, running_job

BATCH_SIZE = 8
CANCEL_AFTER = 12
READERS = 3
DEADLINE_S = 45  # the worker runs until it sees the cancel, as a real one; this bounds a hang


def test_worker_writes_while_ui_reads_and_cancels(repo: Repository) -> None:
    job = running_job(repo, versions=1)
    errors: list[BaseException] = []
    done = threading.Event()

    def guarded(body):
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                done.set()

        return threading.Thread(target=run)

    def worker() -> None:
        version = 0
        deadline = time.monotonic() + DEADLINE_S
        step = 0
        while time.monotonic() < deadline:
            if step % 4 == 3:
                repo.record_policy_version(
                    PolicyVersionRecord(job.id, version + 1, parent_version=version)
                )
                version += 1
            samples = [make_sample(step, g, version=version) for g in range(BATCH_SIZE)]
            repo.record_batch(make_batch(job.id, samples, version=version, step=step))
            step += 1
            if repo.update_progress(job.id, step).cancel_requested:
                repo.mark_cancelled(job.id, f"cancelled at step {step}")
                break
        done.set()

    def reader() -> None:
        seen = 0
        while not done.is_set():
            metrics = repo.version_metrics(job.id)  # one snapshot: batches and samples agree
            samples = sum(m.num_samples for m in metrics)
            batches = sum(m.num_accepted_batches for m in metrics)
            assert samples == batches * BATCH_SIZE, (samples, batches)
            assert samples >= seen
            seen = samples
            page = repo.list_samples(SampleFilter(job.id), limit=BATCH_SIZE * 2, newest_first=True)
            assert len(page.items) % BATCH_SIZE == 0
            repo.get_job(job.id)

    def canceller() -> None:
        while not done.is_set():
            if len(repo.list_batches(job.id)) >= CANCEL_AFTER:
                repo.request_cancel(job.id)
                return
            time.sleep(0.005)

    threads = [guarded(worker), guarded(canceller)] + [guarded(reader) for _ in range(READERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=DEADLINE_S + 15)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)

    final = repo.get_job(job.id)
    assert final.status is JobStatus.CANCELLED
    batches = repo.list_batches(job.id)
    assert len(batches) >= CANCEL_AFTER
    assert final.step == len(batches)
    assert final.error == f"cancelled at step {len(batches)}"
    total = repo.list_samples(SampleFilter(job.id), limit=1000).items
    assert len(total) == len(batches) * BATCH_SIZE
    assert final.current_version == repo.latest_version(job.id).version
