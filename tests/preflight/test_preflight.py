"""Pre-flight: the output folder, stale temp files, and memory estimates against the machine."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vitexport.errors import BadInput, ResourceLimit
from vitexport.io import atomic_write_text
from vitexport.preflight import Need, available_memory, check_output_folder, require
from vitexport.preflight.memory import forward_need, histogram_need


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_files_of_a_killed_run_are_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead = _dead_pid()
    stale = [out / f".model.int8.onnx.vxtmp{dead}-abc123_x.onnx", out / f".model.int8.onnx.vxtmp{dead}-abc123_x.onnx.data"]
    live = out / f".parity.json.vxtmp{os.getpid()}-zz9.json"  # a run writing right now keeps its file
    mine = [out / ".notes.txt", out / "model.vxtmp1-x.onnx"]  # not our pattern: never touched
    for p in [*stale, live, *mine]:
        p.write_text("x")
    check_output_folder(out)
    assert not any(p.exists() for p in stale)
    assert live.exists() and all(p.exists() for p in mine)


def test_atomic_writes_use_the_pattern_the_cleanup_knows(tmp_path):
    """A write interrupted mid-way leaves a temp that the next run recognises."""
    from vitexport.io import _TEMP_RE, atomic_path

    with atomic_path(tmp_path / "model.onnx") as tmp:
        assert _TEMP_RE.match(tmp.name) and str(os.getpid()) in tmp.name
        tmp.write_text("x")
    atomic_write_text(tmp_path / "a.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "model.onnx"]


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not bite for root")
def test_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(BadInput, match="not writable"):
            check_output_folder(ro / "out")
    finally:
        ro.chmod(0o755)


def test_an_existing_folder_and_a_new_one_are_fine(tmp_path):
    assert check_output_folder(tmp_path) == tmp_path
    assert check_output_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checking creates nothing


@pytest.mark.parametrize("text,expected", [("8G", 8 << 30), ("512M", 512 << 20), ("1000", 1000), ("2GiB", 2 << 30)])
def test_memory_limit_setting(monkeypatch, text, expected):
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", text)
    assert available_memory() <= expected


def test_require_names_the_largest_need_and_its_setting(monkeypatch):
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "1G")
    require([Need("a", 100 << 20, "x")])  # fits
    with pytest.raises(ResourceLimit, match=r"^b needs about 2.0 GB of memory \(2.3 GB in all\), VITEXPORT_MEMORY_LIMIT=1G "
                                            r"allows 1.0 GB; lower b \(or set VITEXPORT_MEMORY_LIMIT=SIZE if you know it fits\)$"):
        require([Need("a", 300 << 20, "lower a"), Need("b", 2 << 30, "lower b")])
    monkeypatch.delenv("VITEXPORT_MEMORY_LIMIT")
    with pytest.raises(ResourceLimit, match=r", this machine has .* available; lower b \(or set VITEXPORT_MEMORY_LIMIT=SIZE"):
        require([Need("b", 1 << 50, "lower b")])


def test_the_memory_limit_overrides_upward(monkeypatch):
    """VITEXPORT_MEMORY_LIMIT is the user's word both ways: above what the machine reports, a need
    between the two is not refused."""
    monkeypatch.delenv("VITEXPORT_MEMORY_LIMIT", raising=False)
    machine = available_memory()
    need = [Need("a forward", machine + (1 << 30), "x")]
    with pytest.raises(ResourceLimit):
        require(need)
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", str(machine + (2 << 30)))
    assert available_memory() == machine + (2 << 30)
    require(need)


def test_forward_estimate_grows_with_the_attention_matrix():
    """Measured on the model's own geometry: a ViT's attention is quadratic in its tokens, so 4x the
    side (16x the tokens) needs about 256x the attention; the estimate follows (> 100x)."""
    import timm

    def need(size):
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=size).eval()
        return sum(n.nbytes for n in forward_need(model, {"x": (1, 3, size, size)}, {"x": torch.float32}, "s"))

    small, big = need(224), need(896)
    # 197 tokens, 3 heads: scores and softmax 2 x 466 KB plus tokens, MLP; 3137 tokens: 2 x 118 MB
    assert 1e6 < small < 50e6 and big > 100 * small and big > 4 * 2 * 3 * 3137**2 * 4


def test_forward_estimate_of_hierarchical_models_is_their_own():
    """GCViT, TinyViT, NextViT window or pool their attention: the measured forward is megabytes
    (the estimate this replaced took global attention over every stem pixel: 17-42 GB)."""
    import timm

    for name in ("gcvit_xxtiny", "tiny_vit_5m_224", "nextvit_small"):
        model = timm.create_model(name, pretrained=False).eval()
        fwd = forward_need(model, {"x": (1, 3, 224, 224)}, {"x": torch.float32}, "s")[-1]
        assert fwd.what.startswith("one forward pass") and fwd.nbytes < 512 << 20, (name, fwd)


def test_histogram_estimate_follows_the_method():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    assert histogram_need(model, 2048, "minmax") == []
    (need,) = histogram_need(model, 1_000_000_000, "percentile")
    assert need.nbytes > 100e9 and "calibration.num_bins" in need.setting


def test_the_measured_forward_leaves_the_model_untouched():
    """The fake-tensor forward runs on a copy of the module tree: a cache the forward fills (ConViT's
    rel_indices, LeViT's bias cache) holds no fake tensor afterwards, and the weights are not copied."""

    class Caching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.cache = None
            self.seen = {}

        def forward(self, x):
            if self.cache is None:
                self.cache = torch.ones(x.shape[-1])
            self.seen[x.shape[0]] = self.cache
            return self.fc(x * self.cache)

    m = Caching().eval()
    weight = m.fc.weight
    needs = forward_need(m, {"x": (2, 8)}, {"x": torch.float32}, "s", keyword=False)
    assert needs[-1].what.startswith("one forward pass")
    assert m.cache is None and m.seen == {} and m.fc.weight is weight
    assert m(torch.randn(2, 8)).shape == (2, 8)


# --- an --input-shape the model was not built for ---------------------------------------------------
def test_a_shape_the_demo_refuses_is_one_line_naming_the_shape_it_takes(tmp_path):
    """The bundled demo (a 16x16 ViT) at 32x32: one line naming both shapes and torch's reason, before the
    calibration file (of 16x16 digits) is read; none of torch's fake-tensor log (30 lines) reaches the user."""
    from cli_helpers import run_cli

    proc = run_cli("export", "--input-shape", "1,1,32,32", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "does not accept input 'x' of shape 1×1×32×32" in lines[0] and "built for 1×16×16" in lines[0]
    assert "must match the size of tensor" in lines[0] and "demo/model.py:" in lines[0]  # torch's reason, the line
    assert "calib.npz" not in lines[0]
    assert "Traceback" not in proc.stderr and "fake_tensor" not in proc.stderr and "E1" not in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_timm_model_at_a_size_it_was_not_built_for_names_its_img_size():
    from vitexport.sources import load_model

    with pytest.raises(BadInput) as exc:
        load_model("timm:vit_tiny_patch16_224", input_shape="1,3,160,160")
    msg = str(exc.value)
    assert msg.startswith("timm:vit_tiny_patch16_224: the model does not accept input 'x' of shape 1×3×160×160 (")
    assert "Input height (160)" in msg and msg.endswith("built for 3×224×224 (C×H×W): give --input-shape "
                                                         "N,3,224,224 or leave --input-shape out")


def test_a_model_that_takes_other_sizes_still_loads_at_them():
    from vitexport.sources import load_model

    m = load_model("torchvision:resnet18", input_shape="2,3,64,64")
    assert tuple(m.example_inputs["x"].shape) == (2, 3, 64, 64)


def test_a_fake_forward_that_fails_prints_nothing_and_restores_torch_logging(capfd):
    """torch logs a failed fake op with a 30-line traceback at ERROR level; the memory measurement
    only learns "not measured" from it, so nothing is printed, and torch's logger is as it was."""
    import logging

    from vitexport.preflight.geometry import forward_peak_bytes

    class Pos(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(torch.zeros(1, 17, 8))

        def forward(self, x):
            return x + self.pos

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    before = fake_log.level
    assert forward_peak_bytes(Pos(), {"x": (1, 65, 8)}, {"x": torch.float32}, keyword=False) is None
    out, err = capfd.readouterr()
    assert "fake_tensor" not in out + err and "Traceback" not in out + err
    assert fake_log.level == before


def test_the_measured_forward_warns_about_nothing_the_user_wrote():
    """Finding the lru caches walks every live object, torch's deprecated ``torch.distributed.reduce_op``
    proxy among them, which warned (a FutureWarning on every export's terminal). Run in a fresh interpreter with
    that warning an error, since pytest and earlier tests may have shown it once already."""
    code = ("import torch, torch.distributed\n"
            "from vitexport.preflight.geometry import forward_peak_bytes\n"
            "m = torch.nn.Linear(8, 4)\n"
            "peak = forward_peak_bytes(m, {'input': (2, 8)}, {'input': torch.float32}, keyword=False)\n"
            "assert peak is not None and peak > 0, peak\n")
    proc = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FutureWarning" not in proc.stderr
