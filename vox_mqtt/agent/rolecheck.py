"""Check role paths (`module:Class`) where the fleet is edited, not only on the agent's host."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from vox_mqtt.agent.roles import Role

__all__ = ["RoleCheck", "check_role", "check_roles"]

Verdict = Literal["ok", "bad", "unchecked"]


@dataclass(frozen=True, kw_only=True)
class RoleCheck:
    """What checking one role path found: ok, bad (with why), or unchecked (with why not)."""

    spec: str
    verdict: Verdict
    reason: str = ""


def check_roles(specs: Iterable[str]) -> dict[str, RoleCheck]:
    """Check each distinct role path once; return the results by path."""
    return {spec: check_role(spec) for spec in dict.fromkeys(specs)}


def check_role(spec: str) -> RoleCheck:
    """Import a role's module here and look for its class, with "did you mean" for near misses.

    A module that cannot be imported on this machine at all (its package, or a library it
    needs, is not installed here) is reported as unchecked: the agent's host may have it.
    """
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        return RoleCheck(spec=spec, verdict="bad", reason="write it as 'module:Class'")
    module = _import(spec, module_name)
    if isinstance(module, RoleCheck):
        return module
    cls = getattr(module, class_name, None)
    if cls is None:
        roles = [name for name, value in vars(module).items() if _is_role(value)]
        hint = _did_you_mean(class_name, roles)
        listed = f" (its roles: {', '.join(sorted(roles))})" if roles and not hint else ""
        return RoleCheck(
            spec=spec, verdict="bad", reason=f"{module_name} has no {class_name}{hint}{listed}"
        )
    if not _is_role(cls):
        return RoleCheck(
            spec=spec,
            verdict="bad",
            reason=f"{module_name}.{class_name} is not a vox_mqtt Role subclass",
        )
    return RoleCheck(spec=spec, verdict="ok")


def _import(spec: str, module_name: str) -> ModuleType | RoleCheck:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if not _is_part_of(missing, module_name):
            return RoleCheck(
                spec=spec,
                verdict="unchecked",
                reason=f"{module_name} needs {missing!r}, which is not installed here",
            )
        parent, _, leaf = missing.rpartition(".")
        if not parent:
            top = [info.name for info in pkgutil.iter_modules()]
            hint = _did_you_mean(leaf, top)
            return RoleCheck(
                spec=spec,
                verdict="unchecked",
                reason=f"no module {missing!r} on this machine{hint} "
                "(`vox-agent --check` checks it on the agent's host)",
            )
        siblings = _submodules(parent)
        if siblings is None:
            return RoleCheck(spec=spec, verdict="unchecked", reason=f"cannot list {parent!r}")
        hint = _did_you_mean(leaf, siblings)
        return RoleCheck(spec=spec, verdict="bad", reason=f"{parent} has no module {leaf!r}{hint}")
    except Exception as exc:  # a module that fails to import fails on the agent's host too
        return RoleCheck(
            spec=spec,
            verdict="bad",
            reason=f"importing {module_name} failed: {type(exc).__name__}: {exc}",
        )


def _is_part_of(missing: str, module_name: str) -> bool:
    """Return whether the missing module is the role's module or one of its packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _submodules(package: str) -> list[str] | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    return [info.name for info in pkgutil.iter_modules(spec.submodule_search_locations)]


def _is_role(value: object) -> bool:
    return inspect.isclass(value) and issubclass(value, Role) and value is not Role


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        close = [c for c in choices if c.lower() == word.lower()]
    return f" — did you mean {close[0]!r}?" if close else ""
