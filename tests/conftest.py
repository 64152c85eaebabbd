"""Fixtures shared by the bandit and step test modules; the host probe pinned for the whole suite."""

import os

import pytest
import torch

# engine.rollout_dtype: auto samples in bf16 on CPUs with bf16 instructions (policyzoo.native_bf16): every run of the
# suite, and every process it starts, samples as it trains (fp32) whatever the host; tests of auto set it
os.environ["POLICYZOO_NATIVE_BF16"] = "0"

from policyzoo.testing.bandit import bandit_catalog


@pytest.fixture(autouse=True)
def _environment_restored():
    """Every test leaves ``os.environ`` as it found it. A variable set in the test process (``setup_process``'s, a
    cache folder under a test's ``tmp_path``) otherwise reaches every run the worker starts later: CI once hung
    twice 600 s on a ``TORCH_EXTENSIONS_DIR`` left pointing at a test's folder with a lock file in it."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


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
