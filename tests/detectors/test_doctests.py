"""The examples in the detectors' docstrings are documentation: they must stay true.

Every module of the ``detectors`` package is found with ``pkgutil``, so a new detector's
examples run without being listed here.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import detectors

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(detectors.__path__, prefix=f"{detectors.__name__}.")
)


def test_every_module_is_found() -> None:
    assert {"detectors.finding", "detectors.flight_recorder", "detectors.registry"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES, ids=lambda name: name.removeprefix("detectors."))
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=True
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
