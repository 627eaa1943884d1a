"""Issue 45, item 2: a checkpoint's chat template is code anyone can publish (a Hub id makes any
repository a checkpoint). It is rendered in a child process with a deadline per prompt
(``RLWB_TEMPLATE_TIMEOUT``), an address-space limit (``RLWB_TEMPLATE_MEMORY``) and a cap on
what it renders: at submission a template past a bound is refused naming it, and at job start a
cancel ends the render. Each hostile check runs in a process of its own whose address space is
limited (``RLIMIT_AS``), so before the fix the test could not take the machine's memory."""

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core_engine.rl.template_sandbox import MAX_RENDERED_CHARS, RenderCancelled, render_prompts
from db import JobStatus
from tests.workers.helpers import train_config, wait_for
from tests.workers.stack import ROOT
from workers.jobs import run_job
from workers.training import LOADING_PHASE

DEMO = ROOT / "core_engine" / "assets" / "demo-policy"
CHECKER_MEMORY = 3 * 2**30  # the checking process's own bound (the bomb wants 4 GB)
HANG_GUARD_S = 300  # a guard, not a speed bound: the looping template never ends by itself
MEMORY_BOMB = "{{ ('x' * 4*10**9) | length }}"
ENDLESS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
CHECK = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
from workers.job_files import check_prompt_room
from workers.specs import SpecError
try:
    check_prompt_room({{"model": sys.argv[1], "max_tokens": 4}}, [{{"instruction": "2+2?"}}], "set")
    print("accepted")
except SpecError as exc:
    print(exc)
"""


def checkpoint(folder: Path, template: str) -> Path:
    """The demo policy (a 32-token context, a character tokenizer) with ``template``."""
    shutil.copytree(DEMO, folder)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def submission_check(model: Path, **env: str) -> str:
    """What `check_prompt_room` says of ``model`` in a fresh process of bounded memory."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(memory=CHECKER_MEMORY), str(model)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env},
        check=False,
    )
    return done.stdout.strip() or done.stderr[-2000:]


def test_a_template_allocating_gigabytes_is_refused_at_submission(tmp_path):
    said = submission_check(checkpoint(tmp_path / "bomb", MEMORY_BOMB))
    assert said == (
        "the model's chat template needed more than 1,024 MiB of memory to render a prompt "
        "(RLWB_TEMPLATE_MEMORY)"
    )


def test_a_template_that_never_ends_is_refused_at_submission(tmp_path):
    said = submission_check(checkpoint(tmp_path / "loop", ENDLESS), RLWB_TEMPLATE_TIMEOUT="2")
    assert said == (
        "the model's chat template took more than 2 s to render a prompt (RLWB_TEMPLATE_TIMEOUT)"
    )


def test_a_template_rendering_too_much_text_is_refused_at_submission(tmp_path):
    said = submission_check(
        checkpoint(tmp_path / "long", f"{{{{ 'x' * {MAX_RENDERED_CHARS + 1} }}}}")
    )
    assert said == (
        f"the model's chat template renders a prompt of more than {MAX_RENDERED_CHARS:,} characters"
    )


def test_a_cancel_ends_a_render_that_would_run_past_its_deadline(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("RLWB_TEMPLATE_TIMEOUT", str(HANG_GUARD_S))  # a cancel ignored: its error
    tokenizer = AutoTokenizer.from_pretrained(checkpoint(tmp_path / "loop", ENDLESS))
    asked = []

    def cancelled() -> bool:
        asked.append(True)
        return len(asked) > 1  # the cancel arrives while the render runs

    with pytest.raises(RenderCancelled):
        list(render_prompts(tokenizer, [[{"role": "user", "content": "hi"}]], cancelled))


def test_the_child_renders_as_the_tokenizer_does(tmp_path):
    from transformers import AutoTokenizer

    template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}"
    )
    tokenizer = AutoTokenizer.from_pretrained(checkpoint(tmp_path / "roles", template))
    conversations = [
        [{"role": "user", "content": "2+2?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "héllo\n"}],
    ]
    expected = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        for c in conversations
    ]
    assert list(render_prompts(tokenizer, conversations)) == expected
    assert json.dumps(expected).count("<assistant>") == 2


def test_a_cancel_while_the_job_renders_its_prompts_cancels_the_job(
    repo, settings, tiny_model, tmp_path, monkeypatch
):
    """At job start every prompt is rendered (the engine is sized by the longest); with a
    template that never ends and a deadline far away, the cancel alone ends the job."""
    monkeypatch.setenv("RLWB_TEMPLATE_TIMEOUT", str(HANG_GUARD_S * 10))
    model = tmp_path / "loop"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").write_text(ENDLESS)
    job = repo.create_job("train", train_config(str(model), steps=2), total_steps=2)

    def cancel_while_loading(meta: dict) -> None:
        if meta.get("phase") == LOADING_PHASE:
            repo.request_cancel(job.id)

    outcome = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            run_job(repo, job.id, settings, progress=cancel_while_loading)
        ),
        daemon=True,
    )
    worker.start()
    worker.join(HANG_GUARD_S)
    assert outcome, "the job still renders its prompts"
    assert outcome[0].status == "cancelled", outcome[0].error
    assert repo.get_job(job.id).status is JobStatus.CANCELLED


def test_the_render_child_ends_when_its_parent_dies():
    """A template that never ends must not outlive the worker that started its render: a
    parent starts the child, hands it the endless template and a conversation, says so once
    the child is ready (it then renders what is already on its stdin), and is killed."""
    code = (
        "import json, subprocess, sys\n"
        "argv = [sys.executable, '-m', 'core_engine.rl.template_sandbox', str(2**30)]\n"
        "child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        f"header = {{'template': {ENDLESS!r}, 'tokens': {{}}}}\n"
        "child.stdin.write((json.dumps(header) + '\\n[]\\n').encode())\n"
        "child.stdin.flush()\n"
        "child.stdout.readline()\n"
        "print(child.pid, flush=True)\n"
        "child.wait()\n"
    )
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        child = int(parent.stdout.readline())  # ready: rendering
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    wait_for(lambda: _ended(child), HANG_GUARD_S, "the render child to end")


def _ended(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (ended, not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True
