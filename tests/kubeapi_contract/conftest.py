"""Fixtures of the contract suite: every test runs against the fake API server, and against a real cluster
when TANDEM_REAL_KUBECONFIG names a kubeconfig (those runs carry the `realcluster` marker).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.kubeapi_contract.targets import REAL_ENV, Target, start_fake, start_real


def _targets() -> list[Any]:
    params: list[Any] = ["fake"]
    if os.environ.get(REAL_ENV):
        params.append(pytest.param("real", marks=pytest.mark.realcluster))
    return params


@pytest.fixture(params=_targets())
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """The API server under test with default settings (fake: RBAC from manifests/, default watch delay)."""
    t = await (start_fake() if request.param == "fake" else start_real())
    try:
        yield t
    finally:
        await t.aclose()


@pytest.fixture(params=_targets())
async def small_window(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A target whose event history is short (fake: 20 events, bookmarks every 0.5 s, pages of at most 2)."""
    if request.param == "fake":
        t = await start_fake(event_window=20, bookmark_interval_s=0.5, page_size_cap=2)
    else:
        t = await start_real()
    try:
        yield t
    finally:
        await t.aclose()
