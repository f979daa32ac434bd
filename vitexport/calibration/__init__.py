"""Calibration: data readers (images, npz), streaming observers, scale tables and TensorRT caches."""
from .data import (
    ImageFolderSamples,
    NpzSamples,
    SampleSet,
    UnreadableImagesWarning,
    load_samples,
    random_samples,
)
from .observers import ChannelAbsMaxObserver, HistogramObserver, MinMaxObserver, Range, make_observer

__all__ = [
    "SampleSet",
    "NpzSamples",
    "ImageFolderSamples",
    "UnreadableImagesWarning",
    "load_samples",
    "random_samples",
    "Range",
    "HistogramObserver",
    "MinMaxObserver",
    "ChannelAbsMaxObserver",
    "make_observer",
]
