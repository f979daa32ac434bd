"""The zoo's re-initialisation (``zoo_init``): zero BatchNorm scales and 1e-6 layer scales collapse a random
model's activations; re-drawn, they do not; BatchNorm statistics match the activations; seeded; a model
with nothing degenerate is left as it is."""
from __future__ import annotations

import torch
from torch import nn

from zoo_init import realistic_init


class _ZeroBNNet(nn.Module):
    """conv-BN-ReLU stages whose BatchNorms are zero-initialised (ResNet's zero_init_last, RepViT),
    then a branch scaled by a 1e-6 layer scale (timm's init_values)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[m for c_in, c in ((3, 16), (16, 16), (16, 16))
                                    for m in (nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())])
        for m in self.body:
            if isinstance(m, nn.BatchNorm2d):
                nn.init.zeros_(m.weight)
        self.branch = nn.Conv2d(16, 16, 1)
        self.gamma = nn.Parameter(torch.full((16, 1, 1), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * self.branch(self.body(x))


def _x(seed: int) -> torch.Tensor:
    return torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def test_collapsed_activations_come_back():
    torch.manual_seed(0)
    net = _ZeroBNNet().eval()
    with torch.no_grad():
        before = net(_x(1))
    assert float(before.abs().max()) < 1e-5  # every BN multiplies by 0: only biases and the 1e-6 scale remain
    report = realistic_init(net, (_x(0),))
    assert (report.batchnorms, report.zero_bn_scales, report.layer_scales) == (3, 3, 1) and report.bn_stats_measured
    with torch.no_grad():
        after, body = net(_x(1)), net.body(_x(1))
    assert float(after.std()) > 0.05 and float(body.std()) > 0.3
    assert 0.1 <= float(net.gamma.detach().min()) and float(net.gamma.detach().max()) <= 1.0
    assert not any(m.training for m in net.modules())  # back in eval mode


def test_batchnorm_statistics_are_the_activations_own():
    torch.manual_seed(0)
    net = _ZeroBNNet().eval()
    realistic_init(net, (_x(0),))
    conv, bn = net.body[3], net.body[4]
    with torch.no_grad():
        pre = conv(net.body[:3](_x(0)))
    # measured in train mode, where the BatchNorm before normalises by the biased variance (eval: the
    # running, unbiased one), hence a 1e-3 tolerance, not float32's
    torch.testing.assert_close(bn.running_mean, pre.mean((0, 2, 3)), rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(bn.running_var, pre.var((0, 2, 3), unbiased=True), rtol=1e-2, atol=1e-3)
    assert bn.momentum == 0.1  # restored


def test_seeded_and_nothing_degenerate_is_kept():
    torch.manual_seed(0)
    a, b = _ZeroBNNet().eval(), _ZeroBNNet().eval()
    b.load_state_dict(a.state_dict())
    realistic_init(a, (_x(0),), seed=3)
    realistic_init(b, (_x(0),), seed=3)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    plain = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GELU(), nn.Flatten(), nn.LazyLinear(4)).eval()
    plain(_x(0))
    state = {k: v.clone() for k, v in plain.state_dict().items()}
    report = realistic_init(plain, (_x(0),))
    assert not report.changed and all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
