"""Result classes as data: one ``to_dict`` / ``from_dict`` for all of them, through pydantic.

The parity results (:class:`~.metrics.Metrics`, :class:`~.stage.StageResult`, ...) are pydantic
dataclasses (declared with :func:`result`), so they keep dataclass manners (positional construction, mutable fields, their own
``__bool__``) and pydantic validates and serialises them from their type hints: nothing lists
their fields by hand. ``to_dict()`` is the JSON-mode dump (enums as their values; ±inf stays a
float, which ``json.dumps(allow_nan=True)`` writes as ``Infinity``); ``from_dict()`` validates, and
ignores keys it does not know, so ``parity.json`` files of older and newer versions load.
"""
from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Mapping, TypeVar

from pydantic import ConfigDict, PlainSerializer, TypeAdapter, model_serializer
from pydantic.dataclasses import dataclass

from ..recipe import Tolerance

__all__ = ["result", "Data", "Sparse", "TolerancePlain"]

# an SNR of a perfect match is +inf and a cosine of a NaN output -1 / inf distances: keep them as
# floats (pydantic's default writes a non-finite float as null)
_CONFIG = ConfigDict(ser_json_inf_nan="constants")


def result(cls: type | None = None, /, *, frozen: bool = False):
    """Declare a result class: a pydantic dataclass that keeps non-finite floats when dumped."""
    def wrap(c: type) -> type:
        return dataclass(c, config=_CONFIG, frozen=frozen)
    return wrap if cls is None else wrap(cls)

_D = TypeVar("_D", bound="Data")


@cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


class Data:
    """Mixin for pydantic dataclasses: JSON-ready ``to_dict()`` and validating ``from_dict()``."""

    def to_dict(self) -> dict[str, Any]:
        """The object as JSON-ready data (what ``parity.json`` holds)."""
        return _adapter(type(self)).dump_python(self, mode="json")

    @classmethod
    def from_dict(cls: type[_D], data: Mapping[str, Any]) -> _D:
        """Inverse of :meth:`to_dict`.

        Raises:
            pydantic.ValidationError: (a ``ValueError``) ``data`` does not describe a ``cls``.
        """
        return _adapter(cls).validate_python(dict(data))


class Sparse(Data):
    """A :class:`Data` whose unset (``None``) entries are left out of ``to_dict()``: metrics that
    were not measured (top-1 of a feature map) and limits that are not checked."""

    @model_serializer(mode="wrap")
    def _drop_none(self, handler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


def _tolerance_dict(tol: Tolerance) -> dict[str, Any]:
    d = tol.model_dump(mode="json", exclude_none=True)
    if tol.top1_agreement is None:
        d.pop("top1_margin_z", None)  # it qualifies the top-1 gate only
    return d


#: a :class:`~vitexport.recipe.Tolerance` field written without its ungated (``None``) limits
TolerancePlain = Annotated[Tolerance, PlainSerializer(_tolerance_dict, return_type=dict)]
