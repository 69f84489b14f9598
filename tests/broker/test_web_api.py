"""The fleet view's HTTP API on the real broker (loopback), with scripted cluster streams: login and session
cookie, CSRF, tenant isolation, the fleet picture and queue aggregates, live events, and bad input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from broker.config import TlsConfig, WebConfig
from broker.launcher.client import BrokerClient, SubmitItem
from tandem.v1 import job_pb2
from tests.broker.hub_builders import TOKENS, Broker, eventually, node, policy_doc, spec, start_broker, write_policy

pytestmark = pytest.mark.timeout(60)


async def _broker(tmp: Path, **kw: Any) -> Broker:
    return await start_broker(tmp, web=WebConfig(address="127.0.0.1:0", poll_interval_s=0.5), **kw)


class Browser:
    """What a browser does: a cookie jar, the CSRF header on changes, same-origin requests."""

    def __init__(self, broker: Broker) -> None:
        self.base = f"http://127.0.0.1:{broker.servers.web_port}"
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # unsafe: IP-address host
        self.csrf = ""

    async def login(self, who: str) -> dict[str, Any]:
        async with self.http.post(f"{self.base}/api/login", json={"token": TOKENS[who]}) as r:
            assert r.status == 200, await r.text()
            body: dict[str, Any] = await r.json()
            cookie = r.cookies["tandem_session"]
            assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
        self.csrf = body["csrf_token"]
        return body

    async def get(self, path: str, **params: Any) -> tuple[int, Any]:
        async with self.http.get(f"{self.base}{path}", params=params) as r:
            return r.status, await r.json()

    async def post(
        self, path: str, body: Any = None, *, csrf: bool = True, raw: bytes | None = None
    ) -> tuple[int, Any]:
        headers = {"X-CSRF-Token": self.csrf} if csrf else {}
        kw: dict[str, Any] = (
            {"data": raw, "headers": {**headers, "Content-Type": "application/json"}}
            if raw is not None
            else {"json": body or {}, "headers": headers}
        )
        async with self.http.post(f"{self.base}{path}", **kw) as r:
            text = await r.text()
            return r.status, (orjson.loads(text) if text else None)

    async def close(self) -> None:
        await self.http.close()


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = await _broker(tmp_path)
    yield b
    await b.close()


async def _submit(client: BrokerClient, job_set: str, job: job_pb2.JobSpec) -> str:
    [done] = await client.submit(job_set, [SubmitItem(f"{job_set}-{id(job)}", job)])
    assert done.job_id, done
    return done.job_id


async def _connect(broker: Broker, cluster: str = "east") -> Any:
    agent = broker.agent(cluster)
    # two racks of two 8-GPU nodes; one node of r2 is half busy
    await agent.connect(
        [node("n1", rack="r1"), node("n2", rack="r1"), node("n3", rack="r2"), node("n4", rack="r2", free=4)]
    )
    await eventually(lambda: cluster in broker.hub.catalog.clusters and broker.hub.catalog.clusters[cluster].arrays)
    return agent


async def test_login_sets_an_httponly_session_and_the_token_never_comes_back(broker: Broker) -> None:
    b = Browser(broker)
    try:
        status, body = await b.get("/api/session")
        assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
        status, body = await b.post("/api/login", {"token": "not-a-token"}, csrf=False)
        assert status == 401 and body["error"]["message"] == "bearer token is not known"
        session = await b.login("alpha")
        assert session["caller"] == {"kind": "tenant", "name": "alpha"}
        assert TOKENS["alpha"] not in orjson.dumps(session).decode()
        status, body = await b.get("/api/session")
        assert status == 200 and body["caller"]["name"] == "alpha" and body["csrf_token"] == b.csrf
        status, _ = await b.post("/api/logout", csrf=False)
        assert status == 403  # logout is a change: CSRF header required
        status, _ = await b.post("/api/logout")
        assert status == 204
        status, _ = await b.get("/api/session")
        assert status == 401
    finally:
        await b.close()


async def test_the_page_and_its_headers(broker: Broker) -> None:
    b = Browser(broker)
    try:
        async with b.http.get(f"{b.base}/") as r:
            assert r.status == 200 and "text/html" in r.headers["Content-Type"]
            csp = r.headers["Content-Security-Policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            assert "/static/app.js" in await r.text()
        async with b.http.get(f"{b.base}/static/app.js") as r:
            assert r.status == 200
        async with b.http.get(f"{b.base}/static/../web/app.py") as r:
            assert r.status == 404
        status, body = await b.get("/api/nothing-here")
        assert status == 404 and body["error"]["code"] == "NOT_FOUND"
    finally:
        await b.close()


async def test_fleet_picture_counts_free_reserved_and_room_for_the_probe_gang(broker: Broker) -> None:
    await _connect(broker)
    b = Browser(broker)
    try:
        await b.login("alpha")
        status, fleet = await b.get("/api/fleet")
        assert status == 200, fleet
        assert fleet["probe_gpus"] == 8
        [east] = fleet["clusters"]
        assert east["name"] == "east" and east["connected"] and not east["stale"] and east["nodes"] == 4
        [gpus] = east["gpus"]
        assert (gpus["total"], gpus["free"], gpus["reserved"], gpus["used"]) == (32, 28, 0, 4)
        racks = {tuple(d["path"]): d for d in east["domains"]}
        assert set(racks) == {("z1", "r1"), ("z1", "r2")}
        assert racks[("z1", "r1")]["probe_replicas"] == 2 and racks[("z1", "r1")]["whole_free_nodes"] == 2
        assert racks[("z1", "r2")]["probe_replicas"] == 1 and racks[("z1", "r2")]["gpus_free"] == 12
        assert racks[("z1", "r1")]["level"] == "rack"
        assert east["largest_probe_replicas"] == 2
        assert fleet["totals"] == [
            {"model": gpus["model"], "total": 32, "free": 28, "reserved": 0, "used": 4, "unavailable": 0}
        ]
    finally:
        await b.close()


async def test_a_tenant_sees_only_its_own_jobs_and_the_fleet_aggregates(broker: Broker) -> None:
    await _connect(broker)
    alpha, beta = broker.client("alpha"), broker.client("beta")
    # 32 GPUs each: the fleet has them, but 4 are busy, so both wait with a reason
    a_id = await _submit(alpha, "train", spec(gpus=8, replicas=4))
    b_id = await _submit(beta, "secret-beta-set", spec(gpus=8, replicas=4))
    a, bb, admin = Browser(broker), Browser(broker), Browser(broker)
    try:
        await a.login("alpha")
        await bb.login("beta")
        await admin.login("admin")
        status, page = await a.get("/api/jobs")
        assert status == 200 and [j["job_id"] for j in page["jobs"]] == [a_id]
        assert page["jobs"][0]["status"]["state"] == "JOB_STATE_QUEUED"
        status, body = await a.get(f"/api/jobs/{b_id}")
        assert status == 404 and b_id in body["error"]["message"]
        status, body = await a.get("/api/jobs", tenant="beta")
        assert status == 403
        status, page = await admin.get("/api/jobs")
        assert {j["job_id"] for j in page["jobs"]} == {a_id, b_id}

        status, job = await a.get(f"/api/jobs/{a_id}")
        assert status == 200
        info = job["job"]["status"]["queue_info"]
        assert info["reason"].startswith("WAIT_REASON_")
        assert [v["cluster"] for v in info["clusters"]] == ["east"]
        assert info["clusters"][0]["reason"] == "CLUSTER_VERDICT_REASON_INSUFFICIENT_CAPACITY"

        status, queues = await a.get("/api/queues")
        assert status == 200
        assert [t["tenant"] for t in queues["tenants"]] == ["alpha"]
        assert queues["tenants"][0]["queued"] == 1 and queues["fleet"]["queued"] == 2
        assert sum(queues["fleet"]["waiting"].values()) == 2
        assert queues["tenants"][0]["pending_gpus"] == {"": 32}
        status, queues = await admin.get("/api/queues")
        assert [t["tenant"] for t in queues["tenants"]] == ["alpha", "beta"]
        # nothing of beta's in anything alpha can read
        for path in ("/api/fleet", "/api/queues", "/api/jobs"):
            _, doc = await a.get(path)
            text = orjson.dumps(doc).decode()
            assert b_id not in text and "secret-beta-set" not in text
    finally:
        for x in (a, bb, admin):
            await x.close()


async def test_cancel_needs_the_csrf_header_and_the_job_s_own_tenant(broker: Broker) -> None:
    alpha = broker.client("alpha")
    job_id = await _submit(alpha, "s", spec(gpus=8))
    a, bb = Browser(broker), Browser(broker)
    try:
        await a.login("alpha")
        await bb.login("beta")
        status, body = await a.post(f"/api/jobs/{job_id}/cancel", {"reason": "x"}, csrf=False)
        assert status == 403 and "X-CSRF-Token" in body["error"]["message"]
        async with a.http.post(
            f"{a.base}/api/jobs/{job_id}/cancel",
            json={},
            headers={"X-CSRF-Token": a.csrf, "Origin": "http://evil.example"},
        ) as r:
            assert r.status == 403
        status, body = await bb.post(f"/api/jobs/{job_id}/cancel", {"reason": "not mine"})
        assert status == 404
        status, body = await a.post(f"/api/jobs/{job_id}/cancel", {"reason": 7})
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "reason"
        status, body = await a.post(f"/api/jobs/{job_id}/cancel", raw=b"{not json")
        assert status == 400 and body["error"]["message"] == "the request body is not JSON"
        status, body = await a.post(f"/api/jobs/{job_id}/cancel", raw=b'{"reason": "' + b"x" * 70_000 + b'"}')
        assert status == 413 and body["error"]["code"] == "INVALID_ARGUMENT"
        status, body = await a.post(f"/api/jobs/{job_id}/cancel", {"reason": "from the page"})
        assert status == 200 and body["state"] == "JOB_STATE_CANCELLED", body
        job = await alpha.get(job_id)
        assert job.status.state == job_pb2.JOB_STATE_CANCELLED
        audit = (broker.tmp / "audit.jsonl").read_text()
        assert '"method":"CancelJob"' in audit and '"reason":"from the page"' in audit
    finally:
        await a.close()
        await bb.close()


async def test_only_admins_cordon_and_the_fleet_shows_it(broker: Broker) -> None:
    await _connect(broker)
    a, admin = Browser(broker), Browser(broker)
    try:
        await a.login("alpha")
        await admin.login("admin")
        status, body = await a.post("/api/clusters/east/cordon", {"reason": "maintenance"})
        assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
        status, body = await admin.post("/api/clusters/east/cordon", {})
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "reason"
        status, body = await admin.post("/api/clusters/east/cordon", {"reason": "maintenance"})
        assert status == 200 and body["cluster"]["cordoned"] is True
        _, fleet = await a.get("/api/fleet")
        assert fleet["clusters"][0]["cordoned"] and fleet["clusters"][0]["cordon_reason"] == "maintenance"
        status, body = await admin.post("/api/clusters/east/uncordon", {"reason": "done"})
        assert status == 200 and body["cluster"]["cordoned"] is False
        status, body = await admin.post("/api/clusters/nowhere/cordon", {"reason": "x"})
        assert status == 404
    finally:
        await a.close()
        await admin.close()


async def test_bad_query_parameters_are_named(broker: Broker) -> None:
    b = Browser(broker)
    try:
        await b.login("alpha")
        status, body = await b.get("/api/jobs", state="JOB_STATE_BOGUS")
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "state[0]"
        status, body = await b.get("/api/jobs", page_size="many")
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "page_size"
        status, body = await b.get("/api/jobs", colour="blue")
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "colour"
        status, body = await b.get("/api/jobs", page_size="5000")
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "page_size"
        status, body = await b.get("/api/events", from_revision="-1")
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "from_revision"
        status, body = await b.post("/api/login", raw=b"[1, 2]", csrf=False)
        assert status == 400 and body["error"]["field_violations"][0]["field"] == "body"
        # the process is fine after all that
        status, _ = await b.get("/api/jobs")
        assert status == 200
    finally:
        await b.close()


async def _events(b: Browser, n: int, **params: Any) -> list[tuple[str, dict[str, Any]]]:
    """The first `n` job events of a live stream (bookmarks skipped)."""
    out: list[tuple[str, dict[str, Any]]] = []
    async with b.http.get(f"{b.base}/api/events", params=params) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        kind = ""
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "job":
                out.append((kind, orjson.loads(line[6:])))
                if len(out) == n:
                    return out
    return out


async def test_live_events_follow_a_job_and_never_carry_another_tenant_s(broker: Broker) -> None:
    alpha, beta = broker.client("alpha"), broker.client("beta")
    a = Browser(broker)
    try:
        await a.login("alpha")
        # from the revision before the submissions: the stream sees them however late it opens
        since = await broker.hub.store.current_revision()
        reader = asyncio.get_running_loop().create_task(_events(a, 2, from_revision=since))
        await _submit(beta, "b-set", spec(gpus=8))
        job_id = await _submit(alpha, "a-set", spec(gpus=8))
        await alpha.cancel(job_id, "done")
        events = await asyncio.wait_for(reader, 10)
        assert [e["job_id"] for _, e in events] == [job_id, job_id]
        assert events[0][1]["type"] == "JOB_EVENT_TYPE_SUBMITTED"
        assert events[1][1]["job"]["status"]["state"] == "JOB_STATE_CANCELLED"
        # resuming from an event's id replays what came after it
        replay = await asyncio.wait_for(_events(a, 1, from_revision=events[0][1]["revision"]), 10)
        assert replay[0][1]["revision"] == events[1][1]["revision"]
    finally:
        await a.close()


async def test_a_token_taken_out_of_the_policy_ends_its_login(broker: Broker) -> None:
    b = Browser(broker)
    try:
        await b.login("beta")
        write_policy(broker.tmp / "policy.yaml", policy_doc(names=("alpha",)))
        await eventually(lambda: "beta" not in broker.hub.policy.current().tenants, timeout=5)
        status, body = await b.get("/api/jobs")
        assert status == 401
        status, _ = await b.get("/api/session")
        assert status == 401  # the session went with the token
    finally:
        await b.close()


async def test_failed_logins_are_throttled_per_address(broker: Broker) -> None:
    b = Browser(broker)
    try:
        for _ in range(10):
            status, _ = await b.post("/api/login", {"token": "guess"}, csrf=False)
            assert status == 401
        status, body = await b.post("/api/login", {"token": TOKENS["alpha"]}, csrf=False)
        assert status == 429 and body["error"]["code"] == "RESOURCE_EXHAUSTED"
    finally:
        await b.close()


def test_sessions_expire_and_are_bounded() -> None:
    from broker.web.sessions import Sessions

    now = [0.0]
    sessions = Sessions(ttl_s=10.0, max_sessions=2, clock=lambda: now[0])
    first = sessions.open("t1")
    second = sessions.open("t2")
    assert sessions.get(first.id) is first and first.csrf != second.csrf and first.id != second.id
    third = sessions.open("t3")  # past the bound the least recently used goes (first was just read)
    assert sessions.get(second.id) is None and sessions.get(first.id) is first and sessions.get(third.id) is third
    now[0] = 11.0
    assert sessions.get(first.id) is None and len(sessions) == 0
    assert not third.csrf_ok(None) and not third.csrf_ok("x") and third.csrf_ok(third.csrf)


async def test_per_cluster_verdicts_leave_the_event_loop_between_clusters(broker: Broker) -> None:
    """One exact gang fit per cluster, one cluster per turn of the loop: a job page at fleet scale must not
    stall placement and every other call while it is computed."""
    for name in ("c1", "c2", "c3"):
        await _connect(broker, name)
    job_id = await _submit(broker.client("alpha"), "big", spec(gpus=8, replicas=4))
    job = await broker.hub.store.get_job(job_id)
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(other_work())
    await asyncio.sleep(0)
    start = turns
    verdicts = await broker.hub.placer.book.cluster_verdicts(job)
    ticker.cancel()
    assert [v.cluster for v in verdicts] == ["c1", "c2", "c3"]
    assert turns - start >= 3


async def test_served_over_tls_with_a_secure_cookie(tmp_path: Path) -> None:
    import ssl

    from fleetsim.pki import Pki

    (tmp_path / "web-pki").mkdir()
    pki = Pki.create(tmp_path / "web-pki")
    cert, key = pki.issue("fleet-view", server=True)
    broker = await start_broker(
        tmp_path, web=WebConfig(address="127.0.0.1:0", tls=TlsConfig(cert_file=str(cert), key_file=str(key)))
    )
    trust = ssl.create_default_context(cadata=pki.ca_pem.decode())
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            base = f"https://127.0.0.1:{broker.servers.web_port}"
            async with http.post(f"{base}/api/login", json={"token": TOKENS["alpha"]}, ssl=trust) as r:
                assert r.status == 200
                assert r.cookies["tandem_session"]["secure"]
            async with http.get(f"{base}/api/session", ssl=trust) as r:
                assert r.status == 200
            with pytest.raises(aiohttp.ClientError):  # plaintext is not served on the TLS port
                async with http.get(f"http://127.0.0.1:{broker.servers.web_port}/api/session") as r:
                    await r.read()
    finally:
        await broker.close()


def test_client_certificates_are_refused_in_the_web_config() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="client certificates are not used by the fleet view"):
        WebConfig(tls=TlsConfig(cert_file="c.pem", key_file="k.pem", client_ca_file="ca.pem", require_client_cert=True))
