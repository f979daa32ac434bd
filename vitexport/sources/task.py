"""What a model's outputs mean, read from what the source built: the task parity gates beside cosine.

A Hugging Face model says it in its class (``DetrForObjectDetection`` detects, ``SegformerForSemanticSegmentation``
segments, ``DPTForDepthEstimation`` estimates depth, a base ``ViTModel`` / ``Dinov2Model`` / ``CLIPVisionModel``
embeds); a timm model classifies unless built without a head (``num_classes=0``: pooled features); a
torchvision model by its package (``torchvision.models.segmentation``). Anything else classifies, as
vitexport always assumed; ``--task`` overrides what is read here.
"""
from __future__ import annotations

from torch import nn

from ..errors import BadInput
from ..recipe import Task

__all__ = ["infer_task", "parse_task"]

#: a Hugging Face class name's ending → its task (the first that matches)
_HF_SUFFIXES: tuple[tuple[str, Task], ...] = (
    ("ForObjectDetection", Task.detect),
    ("ForSemanticSegmentation", Task.segment),
    ("ForDepthEstimation", Task.depth),
    ("ForImageClassification", Task.classify),
    ("ForImageClassificationWithTeacher", Task.classify),
    ("ForSequenceClassification", Task.classify),
    ("WithProjection", Task.embed),  # CLIPVisionModelWithProjection: image_embeds
    ("Model", Task.embed),  # a base model: ViTModel, Dinov2Model, CLIPVisionModel, BertModel
)


def parse_task(text: str | Task) -> Task:
    """``'detect'`` → ``Task.detect``.

    Raises:
        BadInput: not a task (the message lists them).
    """
    try:
        return Task(text)
    except ValueError:
        raise BadInput(f"--task {text}: unknown task; tasks are {', '.join(Task)}") from None


def infer_task(model: nn.Module, family: str) -> tuple[Task, str]:
    """The task of a built model and why it is that one.

    Args:
        model: the module the source built (not yet wrapped).
        family: ``timm`` | ``torchvision`` | ``hf`` | ``python``.
    Returns:
        (task, reason as the report says it: ``"hf: DetrForObjectDetection"``).
    """
    cls = type(model)
    if family == "hf":
        for suffix, task in _HF_SUFFIXES:
            if cls.__name__.endswith(suffix):
                return task, f"hf: {cls.__name__}"
        return Task.classify, f"hf: {cls.__name__} (no task in its name: classify)"
    if family == "timm":
        if getattr(model, "num_classes", None) == 0:
            return Task.embed, "timm: built without a classifier (num_classes=0)"
        return Task.classify, "timm: a classifier"
    if family == "torchvision":
        where = cls.__module__
        if ".segmentation" in where:
            return Task.segment, f"torchvision: {where}"
        if ".detection" in where:
            return Task.detect, f"torchvision: {where}"
        return Task.classify, "torchvision: a classifier"
    return Task.classify, f"{family}: the default (--task names another)"
