"""Session fixtures: tiny random models with Hugging Face twins."""

import pytest

from core_engine.toy import save_tiny_checkpoint

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
