"""Fixtures shared by the bandit and step test modules."""

import pytest
import torch

from policyzoo.testing.bandit import bandit_catalog


@pytest.fixture(scope="module")
def one_thread():
    # tiny tensors: intra-op threads only add overhead (several times slower on 2 busy cores)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def catalog():
    """The built-in catalog plus the bandit's ``bandit_correct`` reward."""
    return bandit_catalog()
