"""Session fixtures: tiny random models with Hugging Face twins."""

import pytest

from core_engine.rl.episodes.env_sandbox import EnvironmentSession
from core_engine.toy import save_tiny_checkpoint

from .envs_for_tests import SCRIPTED
from .reference import ARCHS, make_pair


@pytest.fixture(scope="session")
def qwen2_pair():
    return make_pair("qwen2")


@pytest.fixture(scope="session", params=ARCHS)
def arch_pair(request):
    return request.param, *make_pair(request.param)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A tiny policy checkpoint on disk for trainer tests (digits and arithmetic symbols)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("policy"), alphabet="0123456789?=+")


@pytest.fixture
def scripted(monkeypatch):
    """Sessions of the scripted test environment (`envs_for_tests.Scripted`; its reset message
    is the child's pid), closed after the test."""
    monkeypatch.setenv("RLWB_ENVIRONMENTS", SCRIPTED)
    sessions = []

    def start(**limits) -> EnvironmentSession:
        sessions.append(EnvironmentSession("scripted", **limits))
        return sessions[-1]

    yield start
    for session in sessions:
        session.close()
