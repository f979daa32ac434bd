"""Hostile inputs for the exit-code contract, each built inside a test's tmp folder.

A :class:`Case` turns a tmp folder into the ``vitexport`` arguments of one careless or hostile
invocation, and says what must come out: the exit code and a piece of the one-line message that
tells the user what to change. The files are real (FIFOs, forged headers, decompression bombs,
models that raise or lie); nothing is mocked.
"""
from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

__all__ = ["Case", "CASES", "USER_MODEL", "write_user_model", "forged_png", "npz_with_header"]

# A tiny 3-channel 32x32 ViT-like model and every way a user's file can misbehave. The model says
# its input size the timm way (pretrained_cfg), so no --input-shape is needed.
USER_MODEL = '''
import sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 16, 8, 8)
        self.heads = 2
        self.norm = nn.LayerNorm(16)
        self.q = nn.Linear(16, 16); self.k = nn.Linear(16, 16); self.v = nn.Linear(16, 16)
        self.head = nn.Linear(16, classes)
        self.pretrained_cfg = {"input_size": (3, 32, 32)}

    def forward(self, x):
        t = self.patch_embed(x).flatten(2).transpose(1, 2)
        h = self.norm(t)
        a = (self.q(h) @ self.k(h).transpose(1, 2) / 4.0).softmax(-1) @ self.v(h)
        return self.head((t + a).mean(1))


class Raises(Net):
    def forward(self, x):
        raise ValueError("forward exploded")


class Exits(Net):
    def forward(self, x):
        sys.exit(4)


class RandomMask(Net):
    def forward(self, x):  # random patch masking left on in eval mode
        keep = (torch.rand(x.shape[0], 1, x.shape[2], x.shape[3]) > 0.5).float()
        return super().forward(x * keep)


class ReturnsNone(Net):
    def forward(self, x):
        return None


class TwoInputs(Net):
    def forward(self, x, y):
        return super().forward(x + y)


class Nan(Net):
    def forward(self, x):
        return super().forward(x) * float("nan")


def build():
    return Net()


def build_raises():
    raise RuntimeError("cannot build this")


def build_exits():
    sys.exit(3)


def build_empty_example():
    return Net(), {}


def build_bad_example():
    return Net(), {"x": "not a tensor"}


def build_scalar_example():
    return Net(), {"x": torch.tensor(1.0)}


def build_wrong_example_names():
    return Net(), {"a": torch.zeros(1, 3, 32, 32), "b": torch.zeros(1, 3, 32, 32)}


def build_forward_raises():
    return Raises()


def build_forward_exits():
    return Exits()


def build_random_mask():
    return RandomMask()


def build_returns_none():
    return ReturnsNone()


def build_two_inputs():
    return TwoInputs()


def build_nan():
    return Nan()


def build_zero_head():  # an untrained, zero-initialised classifier: every output is 0
    m = Net()
    nn.init.zeros_(m.head.weight)
    nn.init.zeros_(m.head.bias)
    return m


def build_no_size():
    m = Net()
    del m.pretrained_cfg
    return m


def not_a_model():
    return 42
'''


def write_user_model(tmp: Path, name: str = "net.py", text: str = USER_MODEL) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def _py(tmp: Path, func: str) -> list[str]:
    return ["--model", f"python:{write_user_model(tmp)}:{func}"]


def _py_text(tmp: Path, text: str) -> list[str]:
    return ["--model", f"python:{write_user_model(tmp, 'broken.py', text)}:build"]


def _npz(tmp: Path, name: str = "data.npz", n: int = 8, **extra) -> Path:
    rng = np.random.default_rng(0)
    np.savez(tmp / name, x=rng.standard_normal((n, 3, 32, 32)).astype(np.float32), **extra)
    return tmp / name


def npz_with_header(path: Path, shape: tuple[int, ...], rows_written: int, compressed: bool) -> Path:
    """An .npz whose member ``x`` declares ``shape`` but holds only ``rows_written`` rows."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    buf.write(np.zeros((rows_written, *shape[1:]), np.float32).tobytes())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED) as z:
        z.writestr("x.npy", buf.getvalue())
    return path


def forged_png(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims ``width`` x ``height`` (no pixel data follows)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))
    return path


def _image_folder(tmp: Path, *, good: int = 0, junk: int = 0, big: bool = False) -> Path:
    from PIL import Image

    d = tmp / "imgs"
    d.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(good):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3)).astype(np.uint8)).save(d / f"good{i}.png")
    for i in range(junk):
        (d / f"junk{i}.jpg").write_bytes(b"not an image at all")
    if big:
        forged_png(d / "huge.png", 100_000, 100_000)
    return d


def _weights(tmp: Path, name: str, sd: dict) -> Path:
    from safetensors.torch import save_file

    save_file(sd, str(tmp / name))
    return tmp / name


def _demo_sd() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from vitexport.demo import DEMO_WEIGHTS

    return load_file(str(DEMO_WEIGHTS))


def _demo(*args: str) -> list[str]:
    from vitexport.demo import DEMO_MODEL_URI

    return ["--model", DEMO_MODEL_URI, *args]


def _hf(tmp: Path, config: dict | None = None, preprocessor: object = None, raw_preprocessor: str | None = None) -> list[str]:
    from transformers import ViTConfig

    d = tmp / "hfvit"
    d.mkdir()
    cfg = ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    image_size=32, patch_size=8, num_labels=5).to_dict()
    cfg.update(config or {})
    (d / "config.json").write_text(json.dumps(cfg))
    if preprocessor is not None:
        (d / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    if raw_preprocessor is not None:
        (d / "preprocessor_config.json").write_text(raw_preprocessor)
    return ["--model", f"hf:{d}"]


def _touch(p: Path, text: str = "x") -> Path:
    p.write_text(text)
    return p


@dataclass(frozen=True)
class Case:
    """One hostile invocation: ``args(tmp)`` builds the files and returns the CLI arguments."""

    name: str
    args: Callable[[Path], list[str]]
    says: str  # a piece of the one-line message (case-insensitive)
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)
    command: str = "export"


def _cases() -> list[Case]:
    C = Case
    return [
        # --- the user's own model code -----------------------------------------------------------
        C("model file raises at import", lambda t: _py_text(t, "raise ValueError('bad import')\n"), "your model code raised ValueError: bad import (broken.py:1)"),
        C("model file has a syntax error", lambda t: _py_text(t, "def build(:\n"), "syntax error"),
        C("model file imports a missing module", lambda t: _py_text(t, "import not_a_module_xyz\n"), "ModuleNotFoundError"),
        C("model file calls sys.exit at import", lambda t: _py_text(t, "import sys\nsys.exit(5)\n"), "called sys.exit(5)"),
        C("build function raises", lambda t: _py(t, "build_raises"), "building the model: your model code raised RuntimeError: cannot build this"),
        C("build function calls sys.exit", lambda t: _py(t, "build_exits"), "called sys.exit(3)"),
        C("forward raises", lambda t: _py(t, "build_forward_raises"), "your model code raised ValueError: forward exploded ("),
        C("forward calls sys.exit", lambda t: _py(t, "build_forward_exits"), "called sys.exit(4)"),
        C("build returns (module, {})", lambda t: _py(t, "build_empty_example"), "example_inputs is empty"),
        C("build returns a non-tensor example", lambda t: _py(t, "build_bad_example"), "dict of name -> tensor"),
        C("build returns a scalar example", lambda t: _py(t, "build_scalar_example"), "needs a batch axis"),
        C("example names fit no forward", lambda t: _py(t, "build_wrong_example_names"), "cannot take the inputs"),
        C("build returns no module", lambda t: _py(t, "not_a_model"), "expected an nn.Module"),
        C("function missing", lambda t: _py(t, "nothing_here"), "no function 'nothing_here'"),
        C("python spec without a function", lambda t: ["--model", f"python:{write_user_model(t)}"], "PATH.py:FUNCTION"),
        C("python path is a directory", lambda t: ["--model", f"python:{t}:build"], "is a directory"),
        C("missing python file", lambda t: ["--model", f"python:{t / 'missing.py'}:build"], "not found"),
        C("forward returns None", lambda t: _py(t, "build_returns_none"), "holds no tensor"),
        C("forward takes two inputs", lambda t: _py(t, "build_two_inputs"), "cannot take the inputs"),
        C("model not deterministic in eval mode", lambda t: _py(t, "build_random_mask"), "different outputs for the same input"),
        C("model outputs NaN", lambda t: _py(t, "build_nan"), "NaN/Inf"),
        C("model does not say its size", lambda t: _py(t, "build_no_size"), "--input-shape N,C,H,W"),
        C("wrong channel count", lambda t: [*_py(t, "build"), "--input-shape", "1,4,32,32"], "takes 3 channels, the input has 4"),
        C("input shape of the wrong rank", lambda t: [*_py(t, "build"), "--input-shape", "1,3,32"], "N,C,H,W"),
        C("zero-sized input shape", lambda t: [*_py(t, "build"), "--input-shape", "0,3,32,32"], "positive"),
        C("malformed input shape", lambda t: ["--model", "timm:vit_tiny_patch16_224", "--input-shape", "1x3xbig"], "--input-shape"),
        C("unknown model scheme", lambda t: ["--model", "pytorch:vit"], "expected one of"),
        C("unknown timm model", lambda t: ["--model", "timm:vit_gigantic_patch99"], "unknown timm model"),
        C("unknown torchvision model", lambda t: ["--model", "torchvision:nope_net"], "unknown torchvision model"),
        # --- Hugging Face folders ------------------------------------------------------------------
        C("hf folder without config", lambda t: ["--model", f"hf:{t}"], "no config.json"),
        C("hf config value of the wrong type", lambda t: _hf(t, {"image_size": "big"}), "'image_size'"),
        C("hf config number as a string", lambda t: _hf(t, {"num_channels": "3"}), "'num_channels'"),
        C("hf config that cannot build", lambda t: _hf(t, {"hidden_act": "no_such_activation"}), "transformers cannot build the model"),
        C("hf config of zero heads", lambda t: _hf(t, {"num_attention_heads": 0}), "'num_attention_heads'"),
        C("hf preprocessor mean of the wrong type", lambda t: _hf(t, preprocessor={"image_mean": "x"}), "'image_mean'"),
        C("hf preprocessor resample as a name", lambda t: _hf(t, preprocessor={"resample": "bicubic"}), "'resample'"),
        C("hf preprocessor that is a list", lambda t: _hf(t, preprocessor=[1, 2]), "expected a JSON object"),
        C("hf preprocessor that is not JSON", lambda t: _hf(t, raw_preprocessor="{nope"), "not valid JSON"),
        C("hf preprocessor std of zero", lambda t: _hf(t, preprocessor={"image_std": [0, 0, 0]}), "image_std"),
        # --- weights ---------------------------------------------------------------------------------
        C("missing weights", lambda t: _demo("--weights", str(t / "nope.safetensors")), "not found"),
        C("empty weights", lambda t: _demo("--weights", str(_touch(t / "w.safetensors", ""))), "empty"),
        C("corrupt weights", lambda t: _demo("--weights", str(_touch(t / "w.safetensors", "\x10" + "\0" * 7 + "{not json" + "\0" * 64))), "safetensors"),
        C("weights directory", lambda t: _demo("--weights", str(t)), "is a directory"),
        C("random bytes as weights", lambda t: _demo("--weights", str(_touch(t / "w.pt", "hello world" * 10))), "neither a safetensors file nor a torch checkpoint"),
        C("npz given as weights", lambda t: _demo("--weights", str(_npz(t))), "not weights"),
        C("int64 weights for float parameters", lambda t: _demo("--weights", str(_weights(t, "w.safetensors", {k: v.to(torch.int64) for k, v in _demo_sd().items()}))), "holds int64 values"),
        C("weights of the wrong shape", lambda t: _demo("--weights", str(_weights(t, "w.safetensors", {k: (v[..., :1].contiguous() if v.ndim > 1 else v) for k, v in _demo_sd().items()}))), "has shape"),
        C("weights of another model", lambda t: _demo("--weights", str(_weights(t, "w.safetensors", {"fc.weight": torch.zeros(2, 2)}))), "do not match the model"),
        # --- memory -----------------------------------------------------------------------------------
        C("input too large for memory", lambda t: [*_py(t, "build"), "--input-shape", "1,3,100000,100000"], "use a smaller --input-shape"),
        C("batch too large for memory", lambda t: ["--set", "export.batch_size=1000000000"], "export.batch_size"),
        C("histograms too large for memory", lambda t: ["--set", "calibration.num_bins=1000000000"], "calibration.num_bins"),
        C("synthetic samples too many", lambda t: [*_demo(), "--set", "parity_data.synthetic_samples=100000000000"], "parity_data.synthetic_samples"),
        C("npz header claims 40M rows", lambda t: ["--parity-data", str(npz_with_header(t / "forged.npz", (40_000_000, 1, 16, 16), 4, False))], "truncated file or forged header"),
        C("compressed npz header claims 40M rows", lambda t: ["--parity-data", str(npz_with_header(t / "forged.npz", (40_000_000, 1, 16, 16), 4, True))], "forged header"),
        C("compressed npz bomb", lambda t: ["--parity-data", str(_bomb(t))], "np.savez", env={"VITEXPORT_MEMORY_LIMIT": "16M"}),
        # --- data --------------------------------------------------------------------------------------
        C("empty calibration folder", lambda t: [*_py(t, "build"), "--calib", str(_mkdir(t / "empty"))], "no image files"),
        C("calibration folder of junk", lambda t: [*_py(t, "build"), "--calib", str(_image_folder(t, junk=3))], "not an image"),
        C("over-large image alone", lambda t: [*_py(t, "build"), "--calib", str(_image_folder(t, big=True))], "too large"),
        C("data of the wrong shape", lambda t: ["--parity-data", str(_npz(t))], "the model input wants"),
        C("missing data path", lambda t: ["--calib", str(t / "nope.npz")], "not found"),
        C("text file named .npz", lambda t: ["--calib", str(_touch(t / "data.npz", "hello"))], "named .npz but not one"),
        C("single .npy file", lambda t: ["--calib", str(_npy(t))], "np.savez"),
        C("single image file", lambda t: [*_py(t, "build"), "--calib", str(next(_image_folder(t, good=1).iterdir()))], "single image"),
        C("zip that holds no arrays", lambda t: ["--calib", str(_zip(t))], "holds no arrays"),
        C("npz with pickled objects", lambda t: ["--calib", str(_object_npz(t))], "not a readable .npz"),
        C("npz with NaN", lambda t: [*_py(t, "build"), "--calib", str(_nan_npz(t))], "NaN"),
        C("all-zero calibration file", lambda t: [*_py(t, "build"), "--calib", str(_zeros_npz(t))], "the data is constant"),
        C("string labels", lambda t: [*_py(t, "build"), "--parity-data", str(_npz(t, y=np.array(["cat"] * 8)))], "'y' holds strings"),
        C("fractional labels", lambda t: [*_py(t, "build"), "--parity-data", str(_npz(t, y=np.full(8, 0.5)))], "integer class indices"),
        C("one-hot labels", lambda t: [*_py(t, "build"), "--parity-data", str(_npz(t, y=np.eye(8, 5)))], "not one-hot"),
        C("negative labels", lambda t: [*_py(t, "build"), "--parity-data", str(_npz(t, y=-np.ones(8, np.int64)))], "negative labels"),
        C("labels beyond the classes", lambda t: [*_py(t, "build"), "--parity-data", str(_npz(t, y=np.full(8, 1000)))], "labels go up to 1000, but the model has 5 outputs"),
        C("labels of the wrong count", lambda t: [*_py(t, "build"), "--parity-data", str(_npz(t, y=np.zeros(3, np.int64)))], "3 labels for 8 samples"),
        # --- output folders ---------------------------------------------------------------------------
        C("--out is a file", lambda t: ["--out", str(_touch(t / "afile"))], "is a file, not a folder"),
        C("--out under a file", lambda t: ["--out", str(_touch(t / "afile") / "sub" / "dir")], "no folder can be made under it"),
        C("--out is /", lambda t: ["--out", "/"], "filesystem root"),
        C("--out is the home directory", lambda t: ["--out", str(Path.home())], "home directory"),
        C("--out inside the package", lambda t: ["--out", str(_package() / "out")], "inside the installed vitexport package"),
        C("--out is empty", lambda t: ["--out", ""], "--out is empty"),
        C("--out is a broken link", lambda t: ["--out", str(_dangling(t))], "broken symbolic link"),
        # --- recipes and options -----------------------------------------------------------------------
        C("unknown target", lambda t: ["--target", "jetson-nano"], "unknown target"),
        C("unknown recipe key", lambda t: ["--target", str(_touch(t / "bad.yaml", "target: orin\ncalibration:\n  methd: minmax\n"))], "unknown key"),
        C("mistyped recipe value", lambda t: ["--target", str(_touch(t / "bad.yaml", "target: orin\ncalibration:\n  num_samples: many\n"))], "num_samples"),
        C("recipe that is not YAML", lambda t: ["--target", str(_touch(t / "bad.yaml", "a: [b\n"))], "cannot read recipe"),
        C("recipe that is a list", lambda t: ["--target", str(_touch(t / "bad.yaml", "- a\n- b\n"))], "must be a mapping"),
        C("unknown --set key", lambda t: ["--set", "quantization.equalise=false"], "unknown key"),
        C("--set without a value", lambda t: ["--set", "calibration.method"], "KEY=VALUE"),
        C("--set of a float batch", lambda t: ["--set", "export.batch_size=1e9"], "export.batch_size"),
        C("bad memory limit setting", lambda t: [], "VITEXPORT_MEMORY_LIMIT", env={"VITEXPORT_MEMORY_LIMIT": "lots"}),
        # --- the parity command ------------------------------------------------------------------------
        C("parity of a folder without a report", lambda t: [str(t)], "no parity report", command="parity"),
        C("parity of a corrupt report", lambda t: [str(_corrupt_report(t))], "not a parity report", command="parity"),
        C("parity --compare without data", lambda t: ["--compare", "a.onnx", "b.onnx"], "--parity-data", command="parity"),
        C("parity without a folder", lambda t: [], "give OUT_DIR", command="parity"),
    ]


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


def _package() -> Path:
    import vitexport

    return Path(vitexport.__file__).resolve().parent


def _dangling(tmp: Path) -> Path:
    link = tmp / "link"
    os.symlink(tmp / "nowhere" / "at-all", link)
    return link


def _npy(tmp: Path) -> Path:
    with open(tmp / "data.npz", "wb") as fh:  # an .npy under an .npz name: told apart by content
        np.save(fh, np.zeros((4, 1, 16, 16), np.float32))
    return tmp / "data.npz"


def _zip(tmp: Path) -> Path:
    with zipfile.ZipFile(tmp / "data.npz", "w") as z:
        z.writestr("readme.txt", "no arrays here")
    return tmp / "data.npz"


def _object_npz(tmp: Path) -> Path:
    np.savez(tmp / "data.npz", x=np.array([{"a": 1}] * 4, dtype=object))
    return tmp / "data.npz"


def _nan_npz(tmp: Path) -> Path:
    x = np.zeros((4, 3, 32, 32), np.float32)
    x[2, 1, 3, 4] = np.nan
    np.savez(tmp / "data.npz", x=x)
    return tmp / "data.npz"


def _zeros_npz(tmp: Path) -> Path:
    np.savez(tmp / "zeros.npz", x=np.zeros((8, 3, 32, 32), np.float32))
    return tmp / "zeros.npz"


def _bomb(tmp: Path) -> Path:
    """A compressed .npz inflating about 1000x: 64 MB of zeros in some 64 KB."""
    np.savez_compressed(tmp / "bomb.npz", x=np.zeros((65536, 1, 16, 16), np.float32))
    return tmp / "bomb.npz"


def _corrupt_report(tmp: Path) -> Path:
    (tmp / "parity.json").write_text('{"passed": tru')
    return tmp


CASES = _cases()
