"""Calibration: data readers (images, npz), streaming observers, scale tables."""
from .data import (
    ImageFolderSamples,
    NpzFileSamples,
    NpzSamples,
    SampleSet,
    UnreadableImagesWarning,
    load_samples,
    random_samples,
)
from .observers import ChannelAbsMaxObserver, HistogramObserver, MinMaxObserver, Range, make_observer
from .table import ScaleTable

__all__ = [
    "SampleSet",
    "NpzSamples",
    "NpzFileSamples",
    "ImageFolderSamples",
    "UnreadableImagesWarning",
    "load_samples",
    "random_samples",
    "Range",
    "HistogramObserver",
    "MinMaxObserver",
    "ChannelAbsMaxObserver",
    "make_observer",
    "ScaleTable",
]
