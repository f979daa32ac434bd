"""The target registry: names → :class:`~.base.Target` classes, and recipes resolved through it.

A target registers itself when its module is imported, with the :func:`register_target` decorator
(as timm registers models); vitexport's own modules are imported by ``vitexport.targets``. A
third-party package adds targets without touching vitexport by declaring its module in the
``vitexport.targets`` entry-point group::

    [project.entry-points."vitexport.targets"]
    rk3588 = "my_package.rk3588"      # a module whose Target subclass carries @register_target

Entry points are loaded the first time the registry is read. A name is registered once: a second
class under a name the registry holds is refused (:class:`ValueError`), whoever registers it.
"""
from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path
from typing import Sequence, TypeVar

from ..errors import BadInput, VitexportWarning
from ..recipe import Recipe, read_recipe
from ._base import Target

__all__ = [
    "PluginWarning",
    "ENTRY_POINT_GROUP",
    "DEFAULT_TARGET",
    "register_target",
    "registered_targets",
    "target_class",
    "build_target",
    "recipe_file",
    "load_recipe",
    "load_target",
]

ENTRY_POINT_GROUP = "vitexport.targets"
#: the target ``vitexport export`` / ``check`` / ``parity`` use when none is named
DEFAULT_TARGET = "orin"

T = TypeVar("T", bound=type[Target])

_TARGETS: dict[str, type[Target]] = {}
_entry_points_loaded = False


class PluginWarning(VitexportWarning):
    """A ``vitexport.targets`` entry point could not be loaded; its targets are missing."""


def register_target(cls: T) -> T:
    """Class decorator: add a :class:`Target` subclass to the registry under ``cls.name``.

    Raises:
        TypeError: ``cls`` is not a Target subclass or has no ``name``.
        ValueError: another class is registered under that name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Target)):
        raise TypeError(f"@register_target takes a Target subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__} has no 'name': set name = '...' on the class")
    held = _TARGETS.get(name)
    if held is not None and held is not cls:
        raise ValueError(f"target '{name}' is registered already ({held.__module__}.{held.__qualname__}); "
                         f"{cls.__module__}.{cls.__qualname__} needs another name")
    _TARGETS[name] = cls
    return cls


def _load_entry_points() -> None:
    """Import the modules of the ``vitexport.targets`` entry points (once); they register their targets."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
        except Exception as exc:  # a broken plug-in costs its own targets, never vitexport's
            warnings.warn(PluginWarning(f"entry point '{ep.name}' ({ep.value}) of {ENTRY_POINT_GROUP} failed to "
                                        f"load: {type(exc).__name__}: {exc}"), stacklevel=2)
            continue
        if isinstance(loaded, type) and issubclass(loaded, Target):
            register_target(loaded)  # an entry point may name the class itself


def registered_targets() -> dict[str, type[Target]]:
    """Every registered target by name, sorted (vitexport's and the entry points')."""
    _load_entry_points()
    return dict(sorted(_TARGETS.items()))


def target_class(name: str) -> type[Target]:
    """The class registered as ``name``.

    Raises:
        BadInput: no target has that name (the message lists the known ones).
    """
    targets = registered_targets()
    if name not in targets:
        raise BadInput(f"unknown target '{name}'; known targets: {', '.join(targets)}")
    return targets[name]


def build_target(recipe: Recipe) -> Target:
    """The run's :class:`Target` for a validated recipe (build it once, hand it to every stage).

    Raises:
        BadInput: the recipe names a target nobody registered (a recipe built in Python).
    """
    return target_class(recipe.target)(recipe)


def recipe_file(target: str) -> Path:
    """A target name (``orin``) → its default recipe; a path to a YAML file → that file.

    Raises:
        BadInput: neither a known target nor an existing YAML file.
    """
    path = Path(target)
    if path.suffix in {".yaml", ".yml"}:
        if not path.is_file():
            raise BadInput(f"recipe file not found: {path}")
        return path
    return target_class(target).recipe_file()


def load_recipe(target: str | None = None, overrides: Sequence[str] = ()) -> Recipe:
    """Load, override and validate a recipe, its ``target`` checked against the registry.

    Args:
        target: a target name (its default recipe), a path to a YAML file, or None
            (:data:`DEFAULT_TARGET`).
        overrides: ``key.path=value`` strings applied before validation.
    Returns:
        The frozen, validated :class:`~vitexport.recipe.Recipe`.
    Raises:
        BadInput: unknown target, unreadable YAML, unknown key, wrong type, a setting the target
            cannot run (:meth:`Target.check_recipe`); the message names the key path and the file.
    """
    return read_recipe(recipe_file(target or DEFAULT_TARGET), overrides, targets=registered_targets())


def load_target(target: str | None = None, overrides: Sequence[str] = ()) -> Target:
    """:func:`load_recipe`, then :func:`build_target`: the run's target from a name or a file."""
    return build_target(load_recipe(target, overrides))
