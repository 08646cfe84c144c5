"""One registry idiom for every component a config names: training methods (`method.name`),
environments (`task.environment`), eval suites (`eval.suites`), teacher kinds (`teacher.kind`),
student families (`student.arch`) and rollout engines (`rollout.engine`).

A registry maps a name to where its implementation lives, "package.module:attribute", imported
the first time that name is built: checking a name (config validation, `--list`) imports nothing
but the registry. Code outside the project adds its own the same way, before the run is built:

    from rl.methods import METHODS
    METHODS.register("my_method", "my_package.my_method:MyMethod")

An unknown name raises `UnknownName`, which states the config key and lists the choices.
This module lives in the lowest package that has registries and imports nothing of the project,
so every package may use it.
"""
from __future__ import annotations

import importlib
from typing import Any, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no registry entry has: the config key, the name and the choices. A KeyError (a
    lookup) and a ValueError (a bad setting), so callers may catch it as either."""

    def __init__(self, key: str, name: Any, choices: list[str]):
        super().__init__(f"{key}={name!r} is unknown; choose one of {choices}")
        self.key, self.name, self.choices = key, name, choices

    def __str__(self) -> str:              # KeyError's own would quote the message
        return self.args[0]


class Registry(Generic[T]):
    """name -> implementation, for the config key `key`. Entries are "module:attribute" strings
    (imported on first use) or the objects themselves."""

    def __init__(self, key: str, entries: dict[str, str | T] | None = None):
        self.key = key
        self._entries: dict[str, str | T] = {}
        for name, where in (entries or {}).items():
            self.register(name, where)

    def register(self, name: str, where: str | T) -> None:
        """Add (or replace) `name`: "package.module:attribute", or the implementation itself."""
        if isinstance(where, str) and where.count(":") != 1:
            raise ValueError(f"{self.key}: register {name!r} as 'package.module:attribute', got {where!r}")
        self._entries[name] = where

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, name: str) -> None:
        """Raise UnknownName unless `name` is registered; imports nothing."""
        if name not in self._entries:
            raise UnknownName(self.key, name, self.names())

    def __getitem__(self, name: str) -> T:
        """The implementation of `name`, imported on first use."""
        self.check(name)
        where = self._entries[name]
        if isinstance(where, str):
            module, attribute = where.split(":")
            try:
                where = getattr(importlib.import_module(module), attribute)
            except (ImportError, AttributeError) as err:
                raise ImportError(f"{self.key}={name!r} is registered at {self._entries[name]!r}, "
                                  f"which does not import: {err}") from err
            self._entries[name] = where
        return where

    def items(self) -> list[tuple[str, T]]:
        """Every (name, implementation), each imported: for listings."""
        return [(name, self[name]) for name in self.names()]
