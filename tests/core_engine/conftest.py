"""Session fixtures: tiny random models with Hugging Face twins."""

import pytest

from .reference import ARCHS, make_pair


@pytest.fixture(scope="session")
def qwen2_pair():
    return make_pair("qwen2")


@pytest.fixture(scope="session", params=ARCHS)
def arch_pair(request):
    return request.param, *make_pair(request.param)
