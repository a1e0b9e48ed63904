import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("INTERQ_TEST_THREADS", "2")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
