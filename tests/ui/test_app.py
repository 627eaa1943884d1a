"""The app as a whole: every event is scriptable, no torch at start-up, safe defaults."""

import ast
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

import ui.app
from ui import cli
from ui.app import build_app, launch

ROOT = Path(__file__).resolve().parents[2]
API_NAMES = {
    "launch",
    "launch_study",
    "launch_source",
    "launch_lora_shown",
    "launch_lora",
    "launch_environment",
    "launch_model_preset",
    "launch_algorithm",
    "launch_rescan",
    "launch_upload",
    "jobs",
    "jobs_live",
    "jobs_pick",
    "resume",
    "jobs_after_resume",
    "job",
    "job_live",
    "job_picked",
    "job_batches",
    "job_picked_batches",
    "cancel",
    "jobs_after_cancel",
    "samples_jobs",
    "samples",
    "samples_next",
    "samples_components",
    "samples_previous",
    "samples_pick",
    "sample",
    "sample_picked",
    "sample_colour",
    "rejected_batches",
    "rejected_pick",
    "batch_samples",
    "compare_jobs",
    "versions",
    "compare",
    "launch_compare",
    "compare_defaults",
    "compare_job_status",
    "playground_jobs",
    "playground_versions",
    "playground_send",
    "playground_submit",
    "playground_clear",
    "queue",
    "queue_opened",
    "queue_workers",
    "audit",
    "clone",
    "job_csv",
    "token_diff",
    "versions_b",
    "compare_defaults_b",
    "compare_jobs_b",
    "runs_jobs",
    "runs_study",
    "runs_metrics",
    "runs_picked",
    "runs",
    "runs_metric",
    "runs_x_axis",
    "runs_smoothing",
    "runs_export",
}


def test_every_event_has_its_own_api_name(services):
    demo = build_app(services)
    names = [fn.api_name for fn in demo.fns.values()]
    assert len(names) == len(set(names)) and set(names) == API_NAMES


def test_importing_the_ui_imports_no_torch():
    code = "import sys, ui.app, ui.cli, ui.__main__; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"


def test_the_ui_has_one_door():
    """ui/ imports nothing of core_engine, and of workers only `workers.api`."""
    imported = set()
    for path in (ROOT / "ui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                imported.update(names if node.module == "workers" else [node.module])
    assert not {name for name in imported if name.startswith("core_engine")}
    assert {name for name in imported if name.startswith("workers")} == {"workers.api"}


def test_launch_binds_to_localhost_without_share_by_default(services, monkeypatch):
    seen = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kwargs: seen.update(kwargs))
    launch(services=services)
    assert seen == {
        "server_name": "127.0.0.1",
        "server_port": 7860,
        "auth": None,
        "share": False,
        "max_file_size": 64 * 2**20,
    }


def test_the_command_line_takes_host_port_share_and_auth(monkeypatch):
    calls = []
    monkeypatch.setattr(ui.app, "launch", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(cli, "upgrade", lambda: calls.append("upgrade"))
    monkeypatch.delenv("RLWB_AUTH", raising=False)
    local = {"allow_unauthenticated": False}
    cli.main(["ui"])
    assert calls == [
        "upgrade",
        {"host": "127.0.0.1", "port": 7860, "auth": None, "share": False, **local},
    ]
    cli.main(["ui", "--host", "0.0.0.0", "--port", "8000", "--share", "--auth", "ann:secret"])
    assert calls[-1] == {
        "host": "0.0.0.0",
        "port": 8000,
        "auth": ("ann", "secret"),
        "share": True,
        **local,
    }
    monkeypatch.setenv("RLWB_AUTH", "bob:pw:with:colons")
    cli.main(["ui"])
    assert calls[-1]["auth"] == ("bob", "pw:with:colons")
    with pytest.raises(SystemExit):
        cli.main(["ui", "--auth", "nopassword"])
    monkeypatch.delenv("RLWB_AUTH")
    for public in (["--share"], ["--host", "0.0.0.0"]):  # never public without a password
        served = len(calls)
        assert cli.main(["ui", *public]) == 2
        assert len(calls) == served
        with pytest.raises(ValueError, match="without a password"):
            launch(host="0.0.0.0" if "--host" in public else "127.0.0.1", share="--share" in public)
    # a share link is public whatever the operator says of the address: a password, always
    assert cli.main(["ui", "--share", "--allow-unauthenticated"]) == 2
