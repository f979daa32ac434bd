"""Results as data: one ``to_dict`` / ``from_dict`` for every report and result class, through pydantic.

Reports and results (a pass's :class:`~vitexport.passes.PassReport`, the export's and simplify's
reports, the parity results :class:`~vitexport.parity.Metrics`, :class:`~vitexport.parity.StageResult`...)
are pydantic dataclasses declared with :func:`result`, so they keep dataclass manners (positional
construction, mutable fields, their own ``__bool__``) and pydantic validates and serialises them
from their type hints: nothing lists their fields by hand. ``to_dict()`` is the JSON-mode dump
(enums as their values; ±inf stays a float, which ``json.dumps(allow_nan=True)`` writes as
``Infinity``); ``from_dict()`` validates, and ignores keys it does not know, so ``parity.json`` files
of older and newer versions load. Settings-like records that are pydantic models already
(``QuantReport``, ``ScaleTable``) dump with ``model_dump(mode="json")``: the same machinery.
"""
from __future__ import annotations

from functools import cache
from typing import Any, Mapping, TypeVar

from pydantic import ConfigDict, TypeAdapter, model_serializer
from pydantic.dataclasses import dataclass

__all__ = ["result", "Data", "Sparse"]

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
