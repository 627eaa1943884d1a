"""Launch tab: model, task or a data file, reward, hyper-parameters, then Launch; or Vary some
fields over seeds and Launch a study of those jobs."""

from functools import partial
from typing import Any

import gradio as gr

from ui.handlers.algorithm_form import (
    ALGORITHM_CHOICES,
    ALGORITHM_FIELDS,
    CUSTOM_ALGORITHM,
    algorithm_form,
)
from ui.handlers.launch import (
    FORM_FIELDS,
    JSONL_SOURCE,
    SINGLE_TURN,
    TASK_DEFAULT_REWARD,
    TASK_SOURCE,
    dataset_choices,
    environment_choices,
    launch_job,
    lr_for_mode,
    reward_choices,
    task_choices,
    upload_dataset,
)
from ui.handlers.model_form import PRESET_FIELDS, model_choices, preset_values
from ui.handlers.train_form import PIPELINE_CHOICES, PIPELINE_INFO
from ui.handlers.vary import launch_study
from ui.services import Services
from ui.tabs.fields import number_field as _number
from ui.tabs.fields import reward_fields
from workers import api


def _show_source(source: str) -> tuple[dict, dict]:
    return gr.update(visible=source == TASK_SOURCE), gr.update(visible=source == JSONL_SOURCE)


def _show_lora(lora: bool) -> dict:
    return gr.update(visible=lora)


def _show_environment(environment: str | None) -> tuple[dict, dict, dict]:
    """An environment's episode limits shown, the rewards hidden (it scores), or the reverse."""
    chosen = bool(environment)
    return (
        gr.update(visible=chosen),
        gr.update(visible=not chosen),
        gr.update(visible=not chosen),
    )


def _apply_preset(model: str | None) -> tuple[dict, ...]:
    """A shipped policy's preset filled in (`PRESET_FIELDS`); another model changes nothing."""
    values = preset_values(model)
    if values is None:
        return tuple(gr.update() for _ in PRESET_FIELDS)
    return tuple(gr.update(value=values[name]) for name in PRESET_FIELDS)


def _apply_algorithm(name: str | None) -> tuple[Any, ...]:
    """An algorithm preset's values in the form's fields it sets (`ALGORITHM_FIELDS`), the
    others unchanged, and its paper."""
    values, paper = algorithm_form(name)
    updates = (gr.update(value=values[f]) if f in values else gr.update() for f in ALGORITHM_FIELDS)
    return (*updates, paper)


def build(services: Services) -> dict[str, gr.components.Component]:
    """The Launch tab's components and events (inside a ``gr.Tab``); returns the form's
    fields by name (`FORM_FIELDS`), for "Clone job" to fill in."""
    d = api.LAUNCH_DEFAULTS
    with gr.Row():
        algorithm = gr.Dropdown(
            ALGORITHM_CHOICES,
            value=CUSTOM_ALGORITHM,
            label="Algorithm",
            info="a published variant: fills in its paper's settings (what the form has no "
            "field for comes with the job); your own values win",
            elem_id="launch-algorithm",
            scale=2,
        )
        algorithm_paper = gr.Markdown(elem_id="launch-algorithm-paper")
    with gr.Row():  # the button keeps its own height beside the labelled dropdown
        model = gr.Dropdown(
            model_choices(services),
            value=d["model"],
            allow_custom_value=True,  # API callers may name any checkpoint under a root
            label="Model",
            info="a built-in policy (choosing one fills in its task), a checkpoint under "
            "RLWB_MODEL_ROOTS, or a Hugging Face Hub id (the worker downloads it unless "
            "HF_HUB_OFFLINE=1, as `make up` sets it)",
            elem_id="launch-model",
            scale=3,
        )
        rescan = gr.Button("Rescan models and data", size="sm", scale=0, min_width=200)
    with gr.Row():  # a stretched group would show as a grey box under the task
        source = gr.Radio(
            [TASK_SOURCE, JSONL_SOURCE], value=TASK_SOURCE, label="Prompts from", scale=1
        )
        with gr.Group(visible=True) as task_group:
            task = gr.Dropdown(task_choices(), value=d["task"], label="Task", elem_id="launch-task")
        with gr.Group(visible=False) as data_group:
            data = gr.Dropdown(
                dataset_choices(services),
                value=None,
                allow_custom_value=True,
                label="Prompt set (JSONL, JSON, CSV, Parquet)",
                info="columns question/prompt/problem -> user and answer/output/solution -> "
                "the reward's reference, never shown to the model (or name them below). Or "
                "{instruction, input, output}: instruction -> system and input -> user, or an "
                "instruction without input -> user; or {messages: [...]}: the system and user "
                "turns are the prompt, the last assistant turn the reference",
                elem_id="launch-data",
            )
            upload = gr.File(
                label="or upload a data file",
                file_types=[".jsonl", ".json", ".csv", ".parquet"],
                height=80,
            )
            with gr.Row():
                prompt_column = gr.Textbox(
                    "", label="Prompt column", placeholder="auto", elem_id="launch-prompt-column"
                )
                answer_column = gr.Textbox(
                    "", label="Answer column", placeholder="auto", elem_id="launch-answer-column"
                )
            system_prompt = gr.Textbox(
                "", label="System prompt (optional)", lines=2, elem_id="launch-system-prompt"
            )
        reward = gr.Dropdown(
            reward_choices(),
            value=TASK_DEFAULT_REWARD,
            allow_custom_value=True,
            label="Reward",
            info="exact_match, numeric_match, math (the answer checked with math-verify), "
            "format (<think>...</think><answer>...</answer>), regex:<RE2 pattern> (1.0 when "
            "the pattern matches the whole response, stripped) or a worker-registered name",
            elem_id="launch-reward",
            scale=1,
        )
    with gr.Accordion(
        "More rewards (weighted sum)", open=False, elem_id="launch-more-rewards"
    ) as more_rewards:
        more = reward_fields()
    with gr.Row():
        environment = gr.Dropdown(
            environment_choices(),
            value=SINGLE_TURN,
            label="Environment",
            info="single turn: one response per prompt, scored by the reward; an "
            "operator-registered environment: multi-turn episodes that it scores itself, "
            "so the reward is not used",
            elem_id="launch-environment",
        )
        with gr.Group(visible=False) as episode_group, gr.Row():
            max_turns = _number(d["max_turns"], label="Max turns", elem_id="launch-max-turns")
            max_episode_tokens = _number(
                d["max_episode_tokens"],
                label="Max episode tokens",
                info="prompt, turns and observations; max tokens is then per turn",
                elem_id="launch-max-episode-tokens",
            )
    upload_message = gr.Markdown()
    with gr.Row():
        steps = _number(d["steps"], label="Steps", elem_id="launch-steps")
        batch_size = _number(d["batch_size"], label="Prompts per batch", elem_id="launch-batch")
        group_size = _number(d["group_size"], label="Group size", elem_id="launch-group")
        lr = _number(d["lr"], label="Learning rate", elem_id="launch-lr")
        lora = gr.Checkbox(
            d["lora"],
            label="LoRA",
            info="train an adapter over the frozen model (learning rate 10x for billion-scale "
            "models, 1e-3 below 100M parameters, as measured on the demo policy; every "
            "version's adapter kept)",
            elem_id="launch-lora",
        )
    with gr.Group(visible=d["lora"]) as lora_group, gr.Row():
        lora_rank = _number(d["lora_rank"], label="LoRA rank", elem_id="lora-rank")
        lora_alpha = _number(d["lora_alpha"], label="LoRA alpha", elem_id="lora-alpha")
        lora_dropout = _number(d["lora_dropout"], label="LoRA dropout", elem_id="lora-dropout")
        lora_target_modules = gr.CheckboxGroup(
            list(api.LINEAR_MODULES),
            value=d["lora_target_modules"],
            label="Target modules",
            info="all ticked: all-linear, every attention and MLP projection",
            elem_id="lora-targets",
            scale=3,
        )
        lora_modules_to_save = gr.CheckboxGroup(
            list(api.SAVABLE_MODULES),
            value=d["lora_modules_to_save"],
            label="Modules to save",
            info="trained whole (not when the LM head is tied to the embedding)",
            elem_id="lora-save",
        )
    with gr.Row():
        temperature = _number(d["temperature"], label="Temperature")
        top_p = _number(d["top_p"], label="Top-p")
        max_tokens = _number(d["max_tokens"], label="Max tokens", elem_id="launch-max-tokens")
        max_policy_lag = _number(d["max_policy_lag"], label="Max policy lag")
        pipeline = gr.Dropdown(
            PIPELINE_CHOICES,
            value=d["pipeline"],
            label="Pipeline",
            info=PIPELINE_INFO,
            elem_id="launch-pipeline",
        )
    with gr.Accordion("More", open=False), gr.Row():
        kv_strategy = gr.Dropdown(list(api.KV_STRATEGIES), value=d["kv_strategy"], label="KV cache")
        clip_eps = _number(d["clip_eps"], label="Clip ε", elem_id="launch-clip-eps")
        kl_coef = _number(d["kl_coef"], label="KL coefficient", elem_id="launch-kl-coef")
        seed = _number(d["seed"], label="Seed")
        updates_per_batch = _number(
            d["updates_per_batch"], label="Updates per batch (reuse within the lag)"
        )
        devices = _number(
            d["devices"],
            label="Devices",
            info="ranks, one per device of the worker's type; the worker must have as many",
            elem_id="launch-devices",
        )
    with (
        gr.Accordion(
            "Held-out accuracy (built-in tasks) and a data file's held-out fraction", open=False
        ),
        gr.Row(),
    ):
        heldout_every = _number(
            d["heldout_every"],
            label="Evaluate every N versions (0: off)",
            elem_id="launch-heldout-every",
        )
        heldout_prompts = _number(d["heldout_prompts"], label="Held-out prompts")
        heldout_fraction = _number(
            0,
            label="Data file: held-out fraction (0: none)",
            info="records held back from training, at most 0.5",
            elem_id="launch-heldout-fraction",
        )
        heldout_k = _number(0, label="mean@k (0: off)", elem_id="launch-heldout-k")
    with gr.Accordion("Experiment trackers", open=False):
        report_to = gr.CheckboxGroup(
            list(api.TRACKERS),
            value=d["report_to"],
            label="Report to",
            info="each version's metrics, named as TRL names them, kept under the job's "
            "directory (the tracker's extra must be installed: rl-workbench[tensorboard])",
            elem_id="launch-report-to",
        )
    with gr.Row(equal_height=True):
        launch = gr.Button("Launch", variant="primary", elem_id="launch-button", scale=1)
        status = gr.Markdown(elem_id="launch-status")
    with gr.Accordion("Vary: a study of this job over fields and seeds", open=False):
        with gr.Row():
            study_name = gr.Textbox(label="Study name", elem_id="vary-name", max_length=64)
            seeds = _number(1, label="Seeds per point", elem_id="vary-seeds")
            concurrency = _number(1, label="Jobs at once (budget)", elem_id="vary-concurrency")
        vary = gr.Textbox(
            label="Fields and values",
            placeholder="lr: 0.001, 0.003\nclip_eps: 0.2, 0.28",
            info="one field per line; every combination runs, each with every seed",
            lines=3,
            max_length=4000,
            elem_id="vary-fields",
        )
        with gr.Row(equal_height=True):
            run = gr.Button("Launch study", elem_id="vary-button", scale=1)
            study_status = gr.Markdown(elem_id="vary-status")

    fields = (algorithm, model, source, task, data, reward, steps, batch_size, group_size, lr)
    fields += (temperature,)
    fields += (top_p, max_tokens, max_policy_lag, kv_strategy, clip_eps, kl_coef, seed)
    fields += (updates_per_batch, pipeline, heldout_every, heldout_prompts, report_to, lora)
    fields += (lora_rank, lora_alpha, lora_dropout, lora_target_modules, lora_modules_to_save)
    fields += (environment, max_turns, max_episode_tokens, devices)
    fields += (prompt_column, answer_column, system_prompt, heldout_fraction, heldout_k, *more)
    form = dict(zip(FORM_FIELDS, fields, strict=True))
    launch.click(
        partial(launch_job, services), inputs_kwargs=form, outputs=status, api_name="launch"
    )
    study = {"study_name": study_name, "vary": vary, "seeds": seeds, "concurrency": concurrency}
    run.click(
        partial(launch_study, services),
        inputs_kwargs={**form, **study},
        outputs=study_status,
        api_name="launch_study",
    )
    source.change(_show_source, source, [task_group, data_group], api_name="launch_source")
    lora.change(_show_lora, lora, lora_group, api_name="launch_lora_shown")  # also on Clone
    environment.change(
        _show_environment,
        environment,
        [episode_group, reward, more_rewards],
        api_name="launch_environment",
    )  # also on Clone
    # the user's choice alone fills in a preset and moves the learning rate (Clone fills in
    # the job's own)
    preset = [form[name] for name in PRESET_FIELDS]
    model.input(_apply_preset, model, preset, api_name="launch_model_preset")
    lora.input(lr_for_mode, [lora, lr, model], lr, api_name="launch_lora")
    algorithm.input(
        _apply_algorithm,
        algorithm,
        [*(form[name] for name in ALGORITHM_FIELDS), algorithm_paper],
        api_name="launch_algorithm",
    )
    rescan.click(partial(_rescan, services), None, [model, data], api_name="launch_rescan")
    upload.upload(
        partial(_after_upload, services),
        [upload, prompt_column, answer_column],
        [data, upload_message],
        api_name="launch_upload",
    )
    return form


def _rescan(services: Services) -> tuple[dict, dict]:
    return gr.update(choices=model_choices(services)), gr.update(choices=dataset_choices(services))


def _after_upload(
    services: Services, file: str | None, prompt_column: str, answer_column: str
) -> tuple[dict, str]:
    choices, stored, message = upload_dataset(services, file, prompt_column, answer_column)
    return gr.update(choices=choices, value=stored), message
