"""Report paths: relative to the working directory when inside it, untouched otherwise."""
from __future__ import annotations

from vitexport.io import display_path


def test_display_path_relativises_inside_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert display_path(str(tmp_path / "data" / "val.npz")) == "data/val.npz"
    assert display_path(f"python:{tmp_path / 'm.py'}:build") == "python:m.py:build"
    assert display_path(f"hf:{tmp_path / 'vit'}") == "hf:vit"


def test_display_path_leaves_other_paths_and_names_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = str(tmp_path.parent / "elsewhere.npz")
    assert display_path(outside) == outside
    assert display_path("timm:vit_tiny_patch16_224") == "timm:vit_tiny_patch16_224"
    assert display_path("val.npz") == "val.npz" and display_path("") == ""
