"""Launch's algorithm presets (the papers' settings in the form's fields, the paper named),
Clone carrying a job's preset, and each train job's algorithm in the Jobs table."""

from tests.core_engine.test_presets import needs_objectives
from tests.ui.test_api import client  # noqa: F401  (the fixture)
from tests.ui.test_launch import form
from ui.handlers.algorithm_form import ALGORITHM_FIELDS, CUSTOM_ALGORITHM, algorithm_form
from ui.handlers.clone import clone_form
from ui.handlers.jobs import jobs_table
from ui.handlers.launch import launch_job
from ui.render import from_inert


def test_a_preset_fills_the_fields_it_sets_and_names_its_paper():
    values, paper = algorithm_form("DAPO")
    assert values == {"clip_eps": 0.2, "kl_coef": 0.0}  # the paper's, where the form has them
    assert "[Yu et al. 2025, DAPO](https://arxiv.org/abs/2503.14476)" in paper
    assert "`dynamic_sampling = True`" in paper and "`overlong` reward added" in paper
    assert algorithm_form("GRPO")[0] == {"clip_eps": 0.2, "kl_coef": 0.04}
    assert algorithm_form(CUSTOM_ALGORITHM) == ({}, "")
    assert set(ALGORITHM_FIELDS) == {"clip_eps", "kl_coef"}


def test_the_algorithm_event_fills_the_form(client):  # noqa: F811
    *fields, paper = client.predict("GSPO", api_name="/launch_algorithm")
    assert [float(f["value"]) for f in fields] == [3e-4, 0.0]  # clip ε, KL coefficient
    assert "https://arxiv.org/abs/2507.18071" in paper


def test_clone_carries_the_jobs_preset(services):
    dapo = services.repository.create_job("train", {**form(), "preset": "DAPO"})
    assert clone_form(services, dapo.id)[0]["preset"] == "DAPO"
    plain = services.repository.create_job("train", form())
    assert clone_form(services, plain.id)[0]["preset"] == CUSTOM_ALGORITHM


def test_the_jobs_table_shows_each_train_jobs_algorithm(services):
    repo = services.repository
    gspo = repo.create_job("train", {**form(), "preset": "GSPO"})
    chosen = repo.create_job("train", {**form(), "loss_type": "bnpo", "advantage": "rloo"})
    plain = repo.create_job("train", form())
    evaluation = repo.create_job("evaluate", {"model": "demo", "task": "always7"})
    table = jobs_table(services).set_index("job")["algorithm"]
    assert table[gspo.id] == "GSPO" and table[chosen.id] == "bnpo / rloo"
    assert table[plain.id] == "default" and table[evaluation.id] == "—"
    for job in (gspo, chosen, plain, evaluation):
        repo.delete_job(job.id)


def test_an_unknown_preset_is_refused_at_launch(services, world):
    message = from_inert(launch_job(services, **form(preset="PPO")))
    assert "Nothing was enqueued" in message and "preset 'PPO': choose one of" in message


@needs_objectives
def test_a_preset_is_launched_and_cloned_with_its_settings(services, world):
    world["queue"].submitted.clear()
    message = launch_job(services, **form(preset="DAPO", **algorithm_form("DAPO")[0]))
    assert "is queued" in message, message
    config = world["queue"].submitted[-1][1]
    assert config["preset"] == "DAPO" and config["clip_eps"] == 0.2
    job = services.repository.create_job("train", config)
    values, _ = clone_form(services, job.id)
    assert values["preset"] == "DAPO"
