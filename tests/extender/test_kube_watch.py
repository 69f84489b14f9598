"""kube.Watcher against kmock: list -> replace, watch -> apply, bookmarks, 410 relist, reconnect with backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmock_lib
import pytest
from kubernetes.aio import client as kclient

from extender import kube
from tests.extender.kube_fakes import (
    RecordingInventory,
    SleepRecorder,
    bookmark,
    event,
    eventually,
    fixture_items,
    gone_status,
    hang,
    node_list,
    times,
    with_rv,
)

NODES = fixture_items("cluster.json", "Node")
PODS = fixture_items("cluster.json", "Pod")

FAST = kube.KubeSettings(backoff_base_s=1.0, backoff_cap_s=8.0, stable_after_s=0.0)


@pytest.fixture
async def api(kmock: Any) -> AsyncIterator[kclient.ApiClient]:
    cfg = kclient.Configuration(host=str(kmock.url).rstrip("/"))
    async with kclient.ApiClient(cfg) as api_client:
        yield api_client


class Running:
    """Runs a watcher as a task and cancels it at the end of the test."""

    def __init__(self, watcher: kube.Watcher) -> None:
        self.watcher = watcher
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> kube.Watcher:
        self.task = asyncio.create_task(self.watcher.run())
        return self.watcher

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        if self.task.done() and self.task.exception() is not None:
            raise self.task.exception()  # type: ignore[misc]
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def node_watches(kmock: Any) -> list[Any]:
    return [r for r in list(kmock) if r.action == kmock_lib.action.WATCH and r.url.path == "/api/v1/nodes"]


def node_lists(kmock: Any) -> list[Any]:
    return [r for r in list(kmock) if r.action == kmock_lib.action.LIST and r.url.path == "/api/v1/nodes"]


def watcher(
    api: kclient.ApiClient, inv: RecordingInventory, sleep: SleepRecorder, *kinds: kube.Kind, **kw: Any
) -> kube.Watcher:
    return kube.Watcher(api, inv, kw.pop("settings", FAST), sleep=sleep, rand=lambda: 1.0, kinds=frozenset(kinds), **kw)


async def test_list_feeds_replace_then_watch_events_apply(kmock: Any, api: kclient.ApiClient) -> None:
    n1, n2, n3 = NODES[0], NODES[1], NODES[2]
    kmock["list v1/nodes"] << node_list("100", [n1, n2])
    kmock["watch v1/nodes"] << iter(
        (
            event("ADDED", with_rv(n3, "101")),
            event("MODIFIED", with_rv({**n1, "spec": {"unschedulable": True}}, "102")),
            event("DELETED", with_rv(n2, "103")),
        )
    )
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)):
        await inv.wait_for(lambda: len(inv.calls) == 4)
        await eventually(lambda: len(node_watches(kmock)) == 2)

    def name(o: dict[str, Any]) -> str:
        return f"/{o['metadata']['name']}"

    assert inv.calls == [
        ("replace", "Node", [name(n1), name(n2)]),
        ("apply", "Node", "ADDED", name(n3)),
        ("apply", "Node", "MODIFIED", name(n1)),
        ("apply", "Node", "DELETED", name(n2)),
    ]
    assert inv.objects["Node"][name(n1)]["spec"] == {"unschedulable": True}
    # Every field the server sent is kept (raw JSON, not a generated model).
    assert inv.objects["Node"][name(n3)]["metadata"]["labels"] == n3["metadata"]["labels"]
    first, second = node_watches(kmock)
    assert first.params["resourceVersion"] == "100"
    assert first.params["allowWatchBookmarks"] == "true"
    # The server closed the first stream normally: resume after the last event, no relist, no backoff.
    assert second.params["resourceVersion"] == "103"
    assert len(node_lists(kmock)) == 1
    assert sleep.delays == []


async def test_bookmark_moves_the_resume_version_without_touching_inventory(kmock: Any, api: kclient.ApiClient) -> None:
    kmock["list v1/nodes"] << node_list("100", NODES[:1])
    kmock["watch v1/nodes"] << iter((bookmark("250"),))
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)) as w:
        await inv.wait_for(lambda: len(inv.calls) == 1)
        await eventually(lambda: len(node_watches(kmock)) == 2)
        assert w.resource_versions[kube.Kind.NODE] == "250"

    assert [c[0] for c in inv.calls] == ["replace"]
    assert [r.params["resourceVersion"] for r in node_watches(kmock)] == ["100", "250"]


@pytest.mark.parametrize("how", ["error-event", "http-410"])
async def test_gone_relists_and_watches_from_the_new_list(kmock: Any, api: kclient.ApiClient, how: str) -> None:
    n1, n2 = NODES[0], NODES[1]
    kmock["list v1/nodes"] << iter((node_list("100", [n1]),))
    kmock["list v1/nodes"] << node_list("500", [n1, n2])
    if how == "error-event":
        kmock["watch v1/nodes"] << iter((event("ADDED", with_rv(n2, "101")), event("ERROR", gone_status())))
    else:
        kmock["watch v1/nodes"] << times(1, 410, gone_status())
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)):
        await inv.wait_for(lambda: inv.kinds_called("replace") == ["Node", "Node"])
        await eventually(lambda: len(node_watches(kmock)) == 2)

    replaces = [c for c in inv.calls if c[0] == "replace"]
    assert replaces[-1] == ("replace", "Node", [f"/{n1['metadata']['name']}", f"/{n2['metadata']['name']}"])
    assert [r.params["resourceVersion"] for r in node_watches(kmock)] == ["100", "500"]
    assert len(node_lists(kmock)) == 2
    assert sleep.delays == []  # the first 410 relists at once


async def test_connection_drop_reconnects_with_growing_backoff_and_resumes(kmock: Any, api: kclient.ApiClient) -> None:
    n1, n2 = NODES[0], NODES[1]
    kmock["list v1/nodes"] << node_list("100", [n1])
    # A stream that delivers one event and then garbage (what a cut proxy stream looks like to the reader),
    # then two refused reconnects (503), then a healthy stream.
    kmock["watch v1/nodes"] << iter((event("ADDED", with_rv(n2, "120")), b'{"type": "MODIF'))
    kmock["watch v1/nodes"] << times(2, 503, {"kind": "Status", "code": 503, "message": "unavailable"})
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)):
        await eventually(lambda: len(node_watches(kmock)) == 4)

    # rand() == 1.0 pins the jitter to its top: delays are min(cap, base * 2**n).
    assert sleep.delays == [1.0, 2.0, 4.0]
    assert [r.params["resourceVersion"] for r in node_watches(kmock)] == ["100", "120", "120", "120"]
    assert len(node_lists(kmock)) == 1
    assert inv.calls[-1] == ("apply", "Node", "ADDED", f"/{n2['metadata']['name']}")


async def test_backoff_is_capped_and_jittered() -> None:
    seq = iter([0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.0])
    b = kube.Backoff(base_s=1.0, cap_s=8.0, rand=lambda: next(seq))
    delays = [b.next_delay() for _ in range(7)]
    # d = 1, 2, 4, 8, 8, 8, 8; delay = d/2 + rand * d/2
    assert delays == [0.5, 1.5, 4.0, 8.0, 8.0, 8.0, 4.0]
    b.reset()
    assert b.failures == 0


async def test_list_failure_backs_off_then_retries_the_list(kmock: Any, api: kclient.ApiClient) -> None:
    kmock["list v1/nodes"] << times(1, 500, {"kind": "Status", "code": 500, "message": "etcd timeout"})
    kmock["list v1/nodes"] << node_list("7", NODES[:2])
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)) as w:
        await w.synced.wait()
        await eventually(lambda: len(node_watches(kmock)) == 1)

    assert sleep.delays == [1.0]
    assert len(node_lists(kmock)) == 2
    assert node_watches(kmock)[0].params["resourceVersion"] == "7"


async def test_list_is_paged_and_replaced_once(kmock: Any, api: kclient.ApiClient) -> None:
    def page(request: Any) -> dict[str, Any]:
        if request.params.get("continue") == "tok-2":
            return node_list("300", PODS[2:], kind="PodList")
        return node_list("300", PODS[:2], kind="PodList", cont="tok-2")

    kmock["list v1/pods"] << page
    kmock["watch v1/pods"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    settings = kube.KubeSettings(list_page_size=2)
    async with Running(watcher(api, inv, sleep, kube.Kind.POD, settings=settings)):
        await inv.wait_for(lambda: len(inv.calls) == 1)

    lists = [r for r in list(kmock) if r.action == kmock_lib.action.LIST]
    assert [(r.params.get("limit"), r.params.get("continue")) for r in lists] == [("2", None), ("2", "tok-2")]
    assert inv.calls[0][2] == [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in PODS]


async def test_inventory_error_relists_after_backoff(kmock: Any, api: kclient.ApiClient) -> None:
    n1, n2 = NODES[0], NODES[1]
    kmock["list v1/nodes"] << node_list("100", [n1])
    kmock["watch v1/nodes"] << iter((event("ADDED", with_rv(n2, "101")),))
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    inv.fail_on = lambda kind, obj: obj["metadata"]["resourceVersion"] == "101"
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)):
        await inv.wait_for(lambda: inv.kinds_called("replace") == ["Node", "Node"])
        await eventually(lambda: len(node_watches(kmock)) == 2)

    assert sleep.delays == [1.0]
    assert [r.params["resourceVersion"] for r in node_watches(kmock)] == ["100", "100"]


async def test_error_event_other_than_410_resumes_after_backoff(kmock: Any, api: kclient.ApiClient) -> None:
    n1, n2 = NODES[0], NODES[1]
    internal = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 500,
        "reason": "InternalError",
        "message": "an error on the server has prevented the request from succeeding",
    }
    kmock["list v1/nodes"] << node_list("100", [n1])
    kmock["watch v1/nodes"] << iter((event("ADDED", with_rv(n2, "140")), event("ERROR", internal)))
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)):
        await eventually(lambda: len(node_watches(kmock)) == 2)

    assert sleep.delays == [1.0]
    assert [r.params["resourceVersion"] for r in node_watches(kmock)] == ["100", "140"]
    assert len(node_lists(kmock)) == 1


async def test_empty_watch_closed_at_once_is_not_hammered(kmock: Any, api: kclient.ApiClient) -> None:
    kmock["list v1/nodes"] << node_list("100", NODES[:1])
    kmock["watch v1/nodes"] << times(3, 200, b"")
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    settings = kube.KubeSettings(backoff_base_s=1.0, backoff_cap_s=8.0, stable_after_s=10.0)
    frozen_clock = lambda: 500.0  # noqa: E731  (every watch "lasted" 0 s)
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE, settings=settings, clock=frozen_clock)):
        await eventually(lambda: len(node_watches(kmock)) == 4)

    # Each watch ended with no event well before stable_after_s: back off, keep the resume version.
    assert sleep.delays == [1.0, 2.0, 4.0]
    assert {r.params["resourceVersion"] for r in node_watches(kmock)} == {"100"}


async def test_repeated_410_right_after_relist_backs_off(kmock: Any, api: kclient.ApiClient) -> None:
    kmock["list v1/nodes"] << node_list("100", NODES[:1])
    kmock["watch v1/nodes"] << times(3, 410, gone_status())
    kmock["watch v1/nodes"] << hang
    inv, sleep = RecordingInventory(), SleepRecorder()
    async with Running(watcher(api, inv, sleep, kube.Kind.NODE)):
        await eventually(lambda: len(node_watches(kmock)) == 4)

    # First 410: relist at once. Then the fresh list's watch is refused again: do not spin.
    assert len(node_lists(kmock)) == 4
    assert sleep.delays == [1.0, 2.0]
