"""The folders jobs write (issue 32, item 6). A job's ``output_dir`` keeps apart from the data
directory and from every other job's folder: a job starts by cleaning its folder, so one
started in job 1's folder deleted job 1's commit in progress before it refused to run. And
``rlwb export DIR`` stages its copy under a name of its own: it deleted the user's ``DIR.tmp``."""

import pytest

from tests.workers.helpers import train_config
from workers import api, commands
from workers.jobs import run_job
from workers.specs import SpecError


def test_an_output_dir_over_the_data_dir_or_another_jobs_folder_is_refused(env, repo, tiny_model):
    first = api.submit_job("train", train_config(tiny_model, output_dir=str(env / "runs" / "a")))
    for output, problem in [
        (env, "is the data directory or holds it"),
        (env.parent, "not under the data directory"),
        (env / "runs" / "a", "overlaps job 1's output folder"),
        (env / "runs" / "a" / "inner", "overlaps job 1's output folder"),
        (env / "runs", "overlaps job 1's output folder"),  # holds job 1's
        (env / "jobs" / "2", "the folders of the jobs that name no output_dir"),
    ]:
        with pytest.raises(SpecError, match=problem):
            api.submit_job("train", train_config(tiny_model, output_dir=str(output)))
    assert [job.id for job in repo.list_jobs()] == [first.id]
    api.submit_job("train", train_config(tiny_model, output_dir=str(env / "runs" / "b")))


# Issue 45, a Low: the embedded broker's folder and the uploads' were accepted (a job cleans
# its folder first, deleting queued messages or uploaded prompt sets).
@pytest.mark.parametrize(
    ("folder", "what"),
    [
        ("broker", "the embedded broker's messages"),
        ("broker/queue", "the embedded broker's messages"),
        ("datasets", "the uploaded prompt sets"),
        ("datasets/mine", "the uploaded prompt sets"),
        ("studies/lr-sweep", "the trackers' folders of the studies"),
        ("trackio", "Trackio's runs"),
    ],
)
def test_an_output_dir_in_the_workbenchs_own_folders_is_refused(
    env, repo, tiny_model, folder, what
):
    output = env / folder
    with pytest.raises(SpecError) as refused:
        api.submit_job("train", train_config(tiny_model, output_dir=str(output)))
    top = env / folder.split("/")[0]
    assert str(refused.value) == f"output_dir: {output} is inside {top}, {what}"
    assert repo.list_jobs() == []


def test_the_worker_refuses_a_job_in_an_earlier_jobs_folder_and_leaves_it_alone(
    repo, settings, tiny_model
):
    """Rows written past the API (or two submissions at once) name the same folder: the
    later job is refused before it touches the folder."""
    folder = settings.data_dir / "runs" / "shared"
    first = repo.create_job("train", train_config(tiny_model, output_dir=str(folder)))
    second = repo.create_job("train", train_config(tiny_model, output_dir=str(folder)))
    in_progress = folder / "version-00001.tmp-attempt1"  # job 1's checkpoint being written
    in_progress.mkdir(parents=True)
    (in_progress / "model.safetensors").write_bytes(b"weights")

    outcome = run_job(repo, second.id, settings, queued=True)

    assert outcome.status == "failed"
    assert f"overlaps job {first.id}'s output folder" in repo.get_job(second.id).error
    assert (in_progress / "model.safetensors").read_bytes() == b"weights"


def test_export_leaves_the_users_folders_beside_its_target_alone(
    repo, settings, tiny_model, tmp_path, capsys
):
    job = repo.create_job("train", train_config(tiny_model, steps=1), total_steps=1)
    assert run_job(repo, job.id, settings).status == "succeeded"
    exports = tmp_path / "exports"
    mine = exports / "v1.tmp"  # the user's, named as the export's staging folder was
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")

    assert commands.main(["export", str(job.id), "1", str(exports / "v1")]) == 0

    assert "checkpoint written to" in capsys.readouterr().out
    assert (mine / "notes.txt").read_text() == "mine"
    assert (exports / "v1" / "model.safetensors").is_file()
    assert sorted(p.name for p in exports.iterdir()) == ["v1", "v1.tmp"]  # no staging left
