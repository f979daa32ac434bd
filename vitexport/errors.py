"""Errors that the CLI turns into one-line messages and exit codes.

Every error a user can cause (a bad file, a bad key, a bad shape) is a :class:`BadInput` (exit 2);
a parity gate that does not hold is a :class:`ParityFailure` (exit 1). Anything else is a bug and is
allowed to raise with a traceback.
"""
from __future__ import annotations

__all__ = ["VitexportError", "BadInput", "ContractViolation", "ParityFailure", "ArtifactWriteError"]


class VitexportError(Exception):
    """Base class: ``exit_code`` is what the CLI returns, ``str(err)`` is the one-line message."""

    exit_code = 2

    def __str__(self) -> str:  # one line, always
        return " ".join(super().__str__().split())


class BadInput(VitexportError):
    """Bad user input: usage, recipe, data, weights or model (exit code 2)."""

    exit_code = 2


class ContractViolation(BadInput):
    """The exported graph breaks the target's contract (op, opset, dtype, dynamic dim)."""


class ParityFailure(VitexportError):
    """A stage's outputs left the recipe's tolerance (exit code 1)."""

    exit_code = 1

    def __init__(self, stage: str, metric: str, value: float, limit: float, op: str):
        self.stage, self.metric, self.value, self.limit, self.op = stage, metric, value, limit, op
        super().__init__(
            f"parity gate failed at stage '{stage}': {metric}={value:.6g} (must be {op} {limit:.6g})"
        )


class ArtifactWriteError(VitexportError):
    """An artifact could not be written (disk full, file too large, permissions); the previous
    version of the file, if any, is left intact (exit code 2)."""

    exit_code = 2
