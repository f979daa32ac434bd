"""Shared fixtures: tiny random-weight models and the bundled demo. No network, CPU only."""
from __future__ import annotations

import pytest
import torch

from cli_helpers import run_cli

# Test models are tiny: one intra-op thread is as fast, and on a loaded 2-core machine two threads
# spinning against each other made a tiny forward ~50x slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """One end-to-end export of the bundled demo for the orin target, shared by the tests that read it."""
    out = tmp_path_factory.mktemp("demo-orin")
    proc = run_cli("export", "--target", "orin", "--out", str(out))
    return out, proc


@pytest.fixture
def tiny_vit_file(tmp_path) -> Path:
    """A user's own model file in the seed style (separate q/k/v, affine LayerNorm)."""
    src = tmp_path / "my_vit.py"
    src.write_text(
        '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 32, 8, 8)
        self.norm = nn.LayerNorm(32)
        self.q = nn.Linear(32, 32); self.k = nn.Linear(32, 32); self.v = nn.Linear(32, 32)
        self.head = nn.Linear(32, 5)
    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        h = self.norm(t)
        a = (self.q(h) @ self.k(h).transpose(1, 2) / 32 ** 0.5).softmax(-1) @ self.v(h)
        return self.head((t + a).mean(1))

def build():
    torch.manual_seed(0)
    return Net()

def build_with_inputs():
    torch.manual_seed(0)
    return Net(), {"image": torch.randn(2, 3, 32, 32)}

def build_tuple_output():
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__(); self.net = Net()
        def forward(self, x):
            return {"logits": self.net(x), "aux": torch.zeros(1)}
    torch.manual_seed(0)
    return Wrap()

def not_a_model():
    return 42
'''
    )
    return src
