"""Item 1: one global resourceVersion, list/watch semantics, compaction (410), bookmarks, timeouts, pagination."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.kubeapi_contract.builders import CONTRACT_LABEL, configmap, lease, node
from tests.kubeapi_contract.kubehttp import expect
from tests.kubeapi_contract.targets import Target


def cm_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/configmaps" + (f"/{name}" if name else "")


OURS = {"labelSelector": CONTRACT_LABEL}


async def test_resource_version_is_one_increasing_integer_across_resources(target: Target) -> None:
    ns_a, ns_b = await target.namespace(), await target.namespace()
    a = expect(await target.admin.post(cm_path(ns_a), configmap("a", ns_a)), 201)
    b = expect(await target.admin.post(cm_path(ns_b), configmap("b", ns_b)), 201)
    a2 = expect(await target.admin.put(cm_path(ns_a, "a"), {**a, "data": {"k": "changed"}}), 200)
    svc = expect(
        await target.admin.post(
            f"/api/v1/namespaces/{ns_a}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "gang"},
                "spec": {"clusterIP": "None", "selector": {"app": "x"}},
            },
        ),
        201,
    )
    rvs = [int(o["metadata"]["resourceVersion"]) for o in (a, b, a2, svc)]
    assert rvs == sorted(rvs) and len(set(rvs)) == 4
    listed = expect(await target.admin.get(cm_path(ns_a)), 200)
    assert listed["kind"] == "ConfigMapList"
    assert int(listed["metadata"]["resourceVersion"]) >= rvs[-1]
    assert [i["metadata"]["resourceVersion"] for i in listed["items"]] == [a2["metadata"]["resourceVersion"]]


async def test_watch_from_a_list_resource_version_delivers_only_later_events(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("before", ns)), 201)
    listed = expect(await target.admin.get(cm_path(ns), **OURS), 200)
    watch = await target.admin.watch(cm_path(ns), resourceVersion=listed["metadata"]["resourceVersion"], **OURS)
    try:
        expect(await target.admin.post(cm_path(ns), configmap("after", ns)), 201)
        expect(
            await target.admin.patch(cm_path(ns, "before"), {"data": {"k": "2"}}, "application/merge-patch+json"), 200
        )
        events = await watch.until(lambda e: e["type"] == "MODIFIED")
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "after"),
            ("MODIFIED", "before"),
        ]
        assert events[0]["object"]["kind"] == "ConfigMap" and events[0]["object"]["apiVersion"] == "v1"
    finally:
        watch.close()


@pytest.mark.parametrize("rv", [None, "0"])
async def test_watch_without_resource_version_first_sends_what_exists(target: Target, rv: str | None) -> None:
    ns = await target.namespace()
    for name in ("one", "two", "three"):
        expect(await target.admin.post(cm_path(ns), configmap(name, ns)), 201)
    params = {} if rv is None else {"resourceVersion": rv}
    watch = await target.admin.watch(cm_path(ns), **params, **OURS)
    try:
        initial = [await watch.next() for _ in range(3)]
        assert all(e is not None and e["type"] == "ADDED" for e in initial)
        assert sorted(e["object"]["metadata"]["name"] for e in initial if e) == ["one", "three", "two"]
        expect(await target.admin.post(cm_path(ns), configmap("four", ns)), 201)
        later = await watch.until(lambda e: e["object"]["metadata"].get("name") == "four")
        assert [e["type"] for e in later] == ["ADDED"]
    finally:
        watch.close()


async def test_events_of_one_watch_arrive_in_resource_version_order(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    listed = expect(await target.admin.get(cm_path(ns), **OURS), 200)
    watch = await target.admin.watch(cm_path(ns), resourceVersion=listed["metadata"]["resourceVersion"], **OURS)
    try:
        for i in range(10):
            expect(
                await target.admin.patch(cm_path(ns, "c"), {"data": {"k": str(i)}}, "application/merge-patch+json"), 200
            )
        events = await watch.until(lambda e: e["object"].get("data", {}).get("k") == "9")
        rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert rvs == sorted(rvs) and len(events) == 10
    finally:
        watch.close()


async def test_watch_from_a_compacted_resource_version_is_an_expired_error_event(small_window: Target) -> None:
    target = small_window
    ns = await target.namespace()
    first = expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    old_rv = first["metadata"]["resourceVersion"]
    if target.is_fake:
        for i in range(25):  # more writes than the fake's 20-event window
            expect(
                await target.admin.patch(cm_path(ns, "c"), {"data": {"k": str(i)}}, "application/merge-patch+json"), 200
            )
    else:
        old_rv = "1"  # long compacted on any real cluster
    watch = await target.admin.watch(cm_path(ns), resourceVersion=old_rv, **OURS)
    try:
        event = await watch.next()
        assert event is not None and event["type"] == "ERROR"
        status = event["object"]
        assert (status["kind"], status["apiVersion"], status["status"], status["code"], status["reason"]) == (
            "Status",
            "v1",
            "Failure",
            410,
            "Expired",
        )
        assert status["message"].startswith("too old resource version: ")
        assert await watch.next() is None  # the server ends the stream after the error
    finally:
        watch.close()


async def test_kubernetes_aio_watch_raises_410_for_a_compacted_version(small_window: Target) -> None:
    from kubernetes.aio import client as kclient
    from kubernetes.aio import watch as kwatch
    from kubernetes.aio.client.exceptions import ApiException

    target = small_window
    ns = await target.namespace()
    first = expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    old_rv = first["metadata"]["resourceVersion"] if target.is_fake else "1"
    for i in range(25 if target.is_fake else 0):
        expect(await target.admin.patch(cm_path(ns, "c"), {"data": {"k": str(i)}}, "application/merge-patch+json"), 200)
    async with kclient.ApiClient(target.aio_configuration()) as api:
        core = kclient.CoreV1Api(api)
        with pytest.raises(ApiException) as raised:
            watcher = kwatch.Watch()  # type: ignore[no-untyped-call]
            async for _ in watcher.stream(
                core.list_namespaced_config_map,
                ns,  # type: ignore[no-untyped-call]
                resource_version=old_rv,
                timeout_seconds=5,
                label_selector=CONTRACT_LABEL,
            ):
                pass
        assert raised.value.status == 410


async def test_an_expired_continue_token_is_http_410(small_window: Target) -> None:
    target = small_window
    target.fake("a real cluster keeps continue tokens until etcd compacts (minutes)")
    ns = await target.namespace()
    for i in range(5):
        expect(await target.admin.post(cm_path(ns), configmap(f"c{i}", ns)), 201)
    page = expect(await target.admin.get(cm_path(ns), limit="2", **OURS), 200)
    token = page["metadata"]["continue"]
    for i in range(25):
        expect(
            await target.admin.patch(cm_path(ns, "c0"), {"data": {"k": str(i)}}, "application/merge-patch+json"), 200
        )
    reply = await target.admin.get(cm_path(ns), limit="2", **OURS, **{"continue": token})
    status = expect(reply, 410)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Expired", 410)
    assert status["message"].startswith(
        "The provided continue parameter is too old to display a consistent list result."
    )


async def test_bookmarks_only_when_allowed_and_carry_only_the_resource_version(small_window: Target) -> None:
    target = small_window
    target.fake("a real server sends bookmarks about once a minute, longer than a unit test")
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    listed = expect(await target.admin.get(cm_path(ns), **OURS), 200)
    with_bm = await target.admin.watch(
        cm_path(ns),
        resourceVersion=listed["metadata"]["resourceVersion"],
        **OURS,
        allowWatchBookmarks="true",
        timeoutSeconds="3",
    )
    without = await target.admin.watch(
        cm_path(ns), resourceVersion=listed["metadata"]["resourceVersion"], **OURS, timeoutSeconds="3"
    )
    try:
        events = await with_bm.until(lambda e: e["type"] == "BOOKMARK")
        bookmark = events[-1]["object"]
        assert bookmark == {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": bookmark["metadata"]["resourceVersion"]},
        }
        assert int(bookmark["metadata"]["resourceVersion"]) >= int(listed["metadata"]["resourceVersion"])
        rest = await without.quiet(4.0)  # the stream ends at timeoutSeconds=3 with nothing in it
        assert rest == [] and without.ended
    finally:
        with_bm.close()
        without.close()


async def test_timeout_seconds_ends_the_stream(target: Target) -> None:
    ns = await target.namespace()
    watch = await target.admin.watch(cm_path(ns), timeoutSeconds="1", **OURS)
    try:
        assert await watch.next(timeout=15) is None
    finally:
        watch.close()


async def test_limit_and_continue_page_through_a_consistent_snapshot(target: Target) -> None:
    """On Leases: nothing else creates them in a fresh namespace, so the whole collection is ours (no selector,
    which would suppress remainingItemCount)."""
    ns = await target.namespace()
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    names = [f"lease-{i}" for i in range(7)]
    for name in names:
        expect(
            await target.admin.post(path, lease(name, ns, holder="a", renew_time="2026-12-01T10:00:00.000000Z")), 201
        )
    first = expect(await target.admin.get(path, limit="3"), 200)
    assert len(first["items"]) == 3 and first["metadata"]["remainingItemCount"] == 4
    late = lease("lease-late", ns, holder="a", renew_time="2026-12-01T10:00:00.000000Z")
    expect(await target.admin.post(path, late), 201)  # not in the snapshot
    seen = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"].get("continue")
    while token:
        page = expect(await target.admin.get(path, limit="3", **{"continue": token}), 200)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert seen == sorted(names)
    everything = expect(await target.admin.get(path), 200)
    assert "continue" not in everything["metadata"] and len(everything["items"]) == 8


async def test_server_side_page_cap_returns_fewer_items_with_a_continue(small_window: Target) -> None:
    target = small_window
    target.fake("the page cap is a knob of the fake")
    ns = await target.namespace()
    for i in range(5):
        expect(await target.admin.post(cm_path(ns), configmap(f"c{i}", ns)), 201)
    page = expect(await target.admin.get(cm_path(ns), limit="4", **OURS), 200)
    assert len(page["items"]) == 2 and page["metadata"]["continue"]


async def test_list_items_carry_no_type_meta(target: Target) -> None:
    ns = await target.namespace()
    expect(await target.admin.post(cm_path(ns), configmap("c", ns)), 201)
    listed = expect(await target.admin.get(cm_path(ns), **OURS), 200)
    assert listed["apiVersion"] == "v1" and "kind" not in listed["items"][0] and "apiVersion" not in listed["items"][0]


async def test_kubernetes_aio_list_and_watch_of_nodes(target: Target) -> None:
    from kubernetes.aio import client as kclient

    body = node(labels={"tandem.dev/contract": "watch"})
    name = body["metadata"]["name"]
    async with kclient.ApiClient(target.aio_configuration()) as api:
        core = kclient.CoreV1Api(api)
        resp = await core.list_node_without_preload_content(label_selector="tandem.dev/contract=watch")
        listed = json.loads(await resp.read())
        stream = await core.list_node_without_preload_content(
            watch=True,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=10,
            label_selector="tandem.dev/contract=watch",
        )
        try:
            model = kclient.V1Node.from_dict(body)
            assert model is not None
            created = await core.create_node(model)
            target.created_cluster_object(f"/api/v1/nodes/{name}")
            line = await asyncio.wait_for(stream.content.readline(), 10)
            event = json.loads(line)
            assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == name
            assert created.metadata is not None and event["object"]["metadata"]["uid"] == created.metadata.uid
        finally:
            stream.close()


async def test_send_initial_events_ends_with_an_annotated_bookmark(target: Target) -> None:
    ns = await target.namespace()
    for name in ("a", "b"):
        expect(await target.admin.post(cm_path(ns), configmap(name, ns)), 201)
    watch = await target.admin.watch(
        cm_path(ns), sendInitialEvents="true", resourceVersionMatch="NotOlderThan", **OURS, allowWatchBookmarks="true"
    )
    try:
        events = await watch.until(lambda e: e["type"] == "BOOKMARK")
        assert sorted(e["object"]["metadata"]["name"] for e in events[:-1]) == ["a", "b"]
        assert all(e["type"] == "ADDED" for e in events[:-1])
        assert events[-1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    finally:
        watch.close()
