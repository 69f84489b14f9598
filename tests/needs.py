"""A test whose dependency (a server binary, a browser) is absent: skipped on a developer's machine, failed in
CI, where `.ci/run` installs every dependency and sets TANDEM_CI=1 — a missing one there is a broken CI, not
a test to pass over."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["missing"]


def missing(what: str) -> NoReturn:
    if os.environ.get("TANDEM_CI"):
        pytest.fail(f"{what}: required in CI (TANDEM_CI is set) but not installed", pytrace=False)
    pytest.skip(f"{what} not installed")
