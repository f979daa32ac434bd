"""The parity results' data helpers: :func:`~vitexport.results.result` / :class:`~vitexport.results.Data`
(the one way vitexport turns a result into data) and :data:`TolerancePlain`, a tolerance as a report
writes it."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import PlainSerializer

from ..recipe import Tolerance
from ..results import Data, Sparse, result

__all__ = ["result", "Data", "Sparse", "TolerancePlain"]


def _tolerance_dict(tol: Tolerance) -> dict[str, Any]:
    d = tol.model_dump(mode="json", exclude_none=True)
    if tol.top1_agreement is None:
        d.pop("top1_margin_z", None)  # it qualifies the top-1 gate only
    return d


#: a :class:`~vitexport.recipe.Tolerance` field written without its ungated (``None``) limits
TolerancePlain = Annotated[Tolerance, PlainSerializer(_tolerance_dict, return_type=dict)]
