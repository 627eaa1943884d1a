"""Compare tab handlers: metrics side by side, distributions, responses side by side, and
launching a compare job."""

import re

from ui.handlers.compare import (
    compare_versions,
    follow_compare_job,
    histogram,
    launch_compare,
    newest_job_with_samples,
    version_choices,
)
from ui.render import from_inert, histogram_html


def test_versions_of_a_job(services, job):
    assert version_choices(services, job.id) == [0, 1, 2, 3]
    assert version_choices(services, None) == [] and version_choices(services, 999) == []


def test_two_versions_side_by_side(services, job):
    metrics, rewards, lengths, pairs, sample = compare_versions(services, job.id, 0, 3)
    first = services.repository.get_sample(sample)  # the token diff's default: from B
    assert (first.policy_version, first.prompt_index, first.group_index) == (3, 0, 0)
    rows = metrics.set_index("metric")
    assert rows.loc["sample reward mean"].tolist() == ["0.25", "1", "0.75"]
    assert rows.loc["samples"].tolist() == ["12", "12", "0"]
    assert rows.loc["KL"].tolist() == ["0", "0.03", "0.03"]
    assert "version 0" in rewards and "version 3" in rewards
    # version 0: 3 of 12 rewarded, version 3: all 12
    assert re.search(r">0</td>.*?>9 / 0</td>", rewards) and re.search(
        r">1</td>.*?>3 / 12<", rewards
    )
    assert "Response tokens" in lengths
    assert pairs.count('<tr class="pair">') == 3
    for prompt in ("5?", "17?", "42?"):
        assert f">{prompt}</div>" in pairs


def test_impossible_comparisons_are_explained(services, job):
    assert "two different versions" in compare_versions(services, job.id, 1, 1)[3]
    assert "choose a job and two versions" in compare_versions(services, job.id, 1, None)[3]
    assert "job 999 does not exist" in compare_versions(services, 999, 0, 1)[3]
    assert "job #1 has no version 99 (its versions: 0, 1, 2, 3)" in from_inert(
        compare_versions(services, job.id, 0, 99)[3]
    )


def test_compare_says_why_it_cannot_compare(services, world, job, tmp_path):
    """A job with one version (or none), and a version of another job whose weights are not
    kept: each refusal says why, where Compare said "choose a job and two versions" or blamed
    missing tokenizer files (issue 43)."""
    from db import BatchRecord, PolicyVersionRecord
    from tests.ui.helpers import _sample
    from ui.handlers.compare import default_versions

    repo, model = world["repo"], world["model"]
    one = repo.create_job("train", {"model": str(model), "task": "always7"}, total_steps=1)
    repo.mark_running(one.id)
    repo.record_policy_version(PolicyVersionRecord(one.id, 0, None, checkpoint_path=str(model)))
    repo.record_batch(BatchRecord(one.id, 0, 0, "accepted", [_sample(model, 0, 0, 0)]))
    pruned = repo.create_job("train", {"model": str(model), "task": "always7"}, total_steps=1)
    repo.mark_running(pruned.id)
    gone = str(tmp_path / "pruned")  # retention deleted it
    repo.record_policy_version(PolicyVersionRecord(pruned.id, 0, None, checkpoint_path=gone))
    empty = repo.create_job("train", {"model": str(model), "task": "always7"}, total_steps=1)

    def why(*view) -> str:
        return from_inert(compare_versions(services, *view)[3])

    assert f"job #{one.id} has only version 0: Compare sets two versions" in why(
        one.id, *default_versions(services, one.id)
    )
    assert f"job #{empty.id} has no version yet" in why(empty.id, None, None)
    assert "or choose Job B" in why(one.id, 0, None)
    assert f"job #{pruned.id} version 0: weights not kept, so its tokenizer" in why(
        one.id, 0, 0, pruned.id
    )
    message, launched = launch_compare(services, one.id, 0, None, "always7", 8, 1, 4)
    assert f"job #{one.id} has only version 0" in from_inert(message) and launched is None
    message, launched = launch_compare(services, job.id, 0, 1, "always7", 8, 1, 4)
    assert f"job #{job.id} version 1: weights not kept, and the held-out" in from_inert(message)
    assert launched is None and world["queue"].submitted == []
    for finished in (one, pruned):
        repo.mark_succeeded(finished.id)
    for made in (one, pruned, empty):
        repo.delete_job(made.id)


def test_histograms_share_bins():
    whole = histogram({"A": [1, 2, 2, 30], "B": [5]})
    assert whole["bin"].tolist()[:3] == ["1–3", "4–6", "7–9"]
    assert whole[whole["version"] == "A"]["count"].tolist()[:2] == [3, 0]
    assert whole.groupby("version")["count"].sum().to_dict() == {"A": 4, "B": 1}
    fractional = histogram({"A": [0.0, 0.5], "B": [1.0]})
    assert len(fractional) == 20 and fractional["bin"].iloc[-1] == "0.9–1"
    assert histogram({"A": [], "B": []}).empty
    html = histogram_html(whole, "Length", {"A": "version 0", "B": "version 3"})
    assert html.count("<tr>") == 10 and "width:100.0%" in html


def test_launch_a_compare_job_on_held_out_prompts(services, world, job):
    message, launched = launch_compare(services, job.id, 0, 3, "always7", 8, 1, 4)
    assert message == f"Compare job **#{launched}** is queued."
    world["repo"].delete_job(launched)
    assert world["queue"].submitted == [
        (
            "compare",
            {
                "job_id": job.id,
                "versions": [0, 3],
                "task": "always7",
                "num_prompts": 8,
                "seed": 1,
                "max_tokens": 4,
            },
        )
    ]


def test_an_invalid_compare_job_is_not_enqueued(services, world, job):
    for args, problem in (
        ((job.id, 2, 2, "always7", 8, 1, 4), "two different versions"),
        ((job.id, 0, 3, "nope", 8, 1, 4), "task: choose one of"),
        ((job.id, 0, 3, "always7", 0, 1, 4), ">= 1"),
        ((None, 0, 3, "always7", 8, 1, 4), "choose a job"),
    ):
        message, launched = launch_compare(services, *args)
        assert problem in from_inert(message) and launched is None
    assert world["queue"].submitted == []


def test_a_launched_compare_job_is_followed_until_it_finishes(services, world, job):
    repo = world["repo"]
    _, launched = launch_compare(services, job.id, 0, 3, "always7", 8, 1, 4)
    assert follow_compare_job(services, launched, job.id, 0, 3) == (
        f"Compare job **#{launched}** is queued.",
        False,
        None,
    )
    repo.mark_running(launched)
    repo.update_progress(launched, 1, 2)
    message, finished, shown = follow_compare_job(services, launched, job.id, 0, 3)
    assert message.endswith("is running: 1 of 2 versions answered.") and not finished
    repo.mark_failed(launched, "version 3: weights not kept")
    message, finished, shown = follow_compare_job(services, launched, job.id, 0, 3)
    assert from_inert(message).endswith("failed: version 3: weights not kept") and finished
    assert shown is None
    repo.delete_job(launched)
    message, finished, shown = follow_compare_job(services, launched, job.id, 0, 3)
    assert from_inert(message) == f"**job {launched} does not exist**" and finished


def test_compare_opens_on_the_newest_job_with_samples(services, world, job):
    repo = world["repo"]
    assert newest_job_with_samples(services) == job.id
    empty = repo.create_job("train", {"model": "demo", "task": "always7"}, total_steps=2)
    assert newest_job_with_samples(services) == job.id  # newer, but nothing to compare yet
    repo.delete_job(empty.id)


def test_compare_opens_on_a_job_with_two_versions_sampled_not_a_newer_one_with_one(
    services, world, job
):
    from db import BatchRecord, PolicyVersionRecord
    from tests.ui.helpers import _sample

    repo, model_dir = world["repo"], world["model"]
    one = repo.create_job("train", {"model": str(model_dir), "task": "always7"}, total_steps=1)
    repo.mark_running(one.id)
    repo.record_policy_version(PolicyVersionRecord(one.id, 0))
    samples = [_sample(model_dir, 0, 0, group) for group in range(2)]
    repo.record_batch(BatchRecord(one.id, 0, 0, "accepted", samples))
    assert newest_job_with_samples(services) == job.id  # versions 0..3 sampled
    repo.mark_succeeded(one.id)
    repo.delete_job(one.id)


def test_compare_defaults_to_versions_with_samples_and_finds_the_held_out_pairs(services, world):
    from db import BatchRecord, PolicyVersionRecord
    from tests.ui.helpers import _sample
    from ui.handlers.compare import default_versions
    from ui.handlers.compare_sides import NO_PAIRS

    repo, model = world["repo"], world["model"]
    train = repo.create_job("train", {"model": str(model), "task": "always7"}, total_steps=2)
    repo.mark_running(train.id)
    for version, prompt in ((0, 0), (1, 1), (2, None)):  # v2: recorded, no samples yet
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(train.id, version, parent))
        if prompt is not None:
            samples = [_sample(model, version, prompt, 0)]
            repo.record_batch(BatchRecord(train.id, version, version, "accepted", samples))
    assert default_versions(services, train.id) == (0, 1)
    _, _, _, pairs, sample = compare_versions(services, train.id, 0, 1)
    assert pairs == NO_PAIRS and sample is None  # different prompts: offer the held-out run

    config = {"job_id": train.id, "versions": [0, 1], "task": "always7"}
    held = repo.create_job("compare", config, total_steps=2)
    repo.mark_running(held.id)
    for version in (0, 1):
        repo.record_policy_version(PolicyVersionRecord(held.id, version, None))
        samples = [_sample(model, version, 2, 0)]
        repo.record_batch(BatchRecord(held.id, version, version, "accepted", samples))
    repo.mark_succeeded(held.id)
    _, _, _, pairs, sample = compare_versions(services, train.id, 0, 1)
    assert f"compare job #{held.id}" in pairs and pairs.count('<tr class="pair">') == 1
    assert services.repository.get_sample(sample).job_id == held.id
    repo.mark_succeeded(train.id)
    repo.delete_job(held.id)
    repo.delete_job(train.id)


def test_the_held_out_comparison_shows_its_pairs_when_it_finishes(services, world):
    """Compare said the held-out comparison had finished but showed no pairs until another
    pick (issue 32): the poll that sees it finish shows them."""
    from db import BatchRecord, PolicyVersionRecord
    from tests.ui.helpers import _sample
    from ui.handlers.compare_sides import NO_PAIRS

    repo, model = world["repo"], world["model"]
    train = repo.create_job("train", {"model": str(model), "task": "always7"}, total_steps=1)
    repo.mark_running(train.id)
    for version in (0, 1):  # each version answered a prompt of its own: no pair
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(train.id, version, parent, str(model)))
        samples = [_sample(model, version, version, 0)]
        repo.record_batch(BatchRecord(train.id, version, version, "accepted", samples))
    repo.mark_succeeded(train.id)
    assert compare_versions(services, train.id, 0, 1)[3] == NO_PAIRS
    _, launched = launch_compare(services, train.id, 0, 1, "always7", 8, 1, 4)
    repo.mark_running(launched)
    for version in (0, 1):  # the compare job's answers to one held-out prompt
        repo.record_policy_version(PolicyVersionRecord(launched, version, None))
        samples = [_sample(model, version, 2, 0)]
        repo.record_batch(BatchRecord(launched, version, version, "accepted", samples))
    assert follow_compare_job(services, launched, train.id, 0, 1)[2] is None  # still running
    repo.mark_succeeded(launched)

    message, finished, shown = follow_compare_job(services, launched, train.id, 0, 1)
    assert "finished" in message and finished
    assert shown is not None
    _, _, _, pairs, sample = shown
    assert f"compare job #{launched}" in pairs and pairs.count('<tr class="pair">') == 1
    assert services.repository.get_sample(sample).job_id == launched
    repo.delete_job(launched)
    repo.delete_job(train.id)
