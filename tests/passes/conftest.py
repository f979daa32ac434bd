"""Fixtures for the pass tests: every family's tiny model run through the three passes once."""
from __future__ import annotations

import pytest
import torch

from passes_zoo import FAMILIES, Pipeline, build_case, run_passes



@pytest.fixture(scope="module", params=FAMILIES)
def family_run(request) -> Pipeline:
    torch.manual_seed(0)
    return run_passes(build_case(request.param))


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread():
    # The test machines share two cores: torch's intra-op threads then spin against each other and a
    # tiny model's forward is ~50x slower. Restored afterwards so other test folders are unaffected.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
