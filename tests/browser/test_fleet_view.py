"""The fleet view in a real browser: Debian's headless Chromium (driven by Playwright, never its downloaded
browsers) opens the page the real broker serves, with scripted clusters on loopback, and checks what a
person would: the clusters and their free GPUs, a job going from QUEUED to RUNNING without a reload, a
waiting job's reason per cluster, a cancel from the page, and that one tenant never sees another's jobs.

With TANDEM_SCREENSHOT_DIR set (`make screenshots`), each page's screenshot is written there (the README
shows the ones under docs/fleet-view/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import async_playwright

from broker.config import WebConfig
from broker.launcher.client import SubmitItem
from tandem.v1 import job_pb2
from tests.broker.hub_builders import A100, H100, TOKENS, AutoCluster, Broker, eventually, node, spec, start_broker
from tests.needs import missing

pytestmark = pytest.mark.timeout(120)

# Flags Chromium needs on a machine without a network or a screen (see the README, "Fleet view").
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = os.environ.get("TANDEM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        missing("Chromium (Debian package chromium)")
    return path


@dataclass
class Fleet:
    broker: Broker
    east: AutoCluster
    base: str
    waiting: str
    """A job of alpha's that cannot fit anywhere now (it could on an empty fleet)."""
    secret: str
    """A job of beta's, with a name alpha must never see."""


async def _submit(broker: Broker, who: str, job_set: str, key: str, job: Any) -> str:
    [done] = await broker.client(who).submit(job_set, [SubmitItem(key, job)])
    assert done.job_id, done
    return done.job_id


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    broker = await start_broker(tmp_path, web=WebConfig(address="127.0.0.1:0", poll_interval_s=0.5))
    east_nodes = [f"e{i}" for i in range(4)]
    agent = broker.agent("east")
    # e3 is half busy (outside Tandem) until the cluster's next report
    await agent.connect([node(n, rack=f"r{i // 2}", free=4 if n == "e3" else 8) for i, n in enumerate(east_nodes)])
    east = AutoCluster(agent, east_nodes, run_s=600)  # runs what it is sent, long enough to be seen running
    east.start()
    west = broker.agent("west")
    await west.connect([node(f"w{i}", model=A100, rack="r9", free=4) for i in range(2)], region="us")
    await eventually(lambda: {"east", "west"} <= {n for n, e in broker.hub.catalog.clusters.items() if e.arrays})
    # 4 x 8 GPUs: east could hold it empty, not now (28 free); west never (2 nodes)
    waiting = await _submit(broker, "alpha", "big", "w1", spec(gpus=8, replicas=4))
    secret = await _submit(broker, "beta", "beta-secret-set", "s1", spec(gpus=8, replicas=4))
    yield Fleet(broker, east, f"http://127.0.0.1:{broker.servers.web_port}", waiting, secret)
    await east.stop()
    await broker.close()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    path = chromium_path()
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS, headless=True)
        yield b
        await b.close()


class Page:
    """One person's browser tab, with every console error and failed request kept."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.problems: list[str] = []
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))

    async def login(self, who: str) -> None:
        await self.page.goto(f"{self.base}/#/fleet")
        await self.page.fill("#login-token", TOKENS[who])
        await self.page.click("#login-submit")
        kind = "admin" if who == "admin" else "tenant"
        await self.page.wait_for_selector(f'[data-testid="whoami"]:has-text("{kind}")')

    async def shot(self, name: str) -> None:
        target = os.environ.get("TANDEM_SCREENSHOT_DIR")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            await self.page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)

    async def text(self, selector: str) -> str:
        return str(await self.page.locator(selector).first.inner_text()).strip()


async def _logged_in(browser: Any, fleet: Fleet, who: str) -> Page:
    """A new browser context's tab, logged in as `who` through the login form."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    tab = Page(await context.new_page(), fleet.base)
    await tab.login(who)
    return tab


async def test_fleet_page_shows_each_cluster_and_its_free_gpus(fleet: Fleet, browser: Any) -> None:
    tab = await _logged_in(browser, fleet, "alpha")
    await tab.page.wait_for_selector('[data-testid="cluster-east"]')
    await tab.page.wait_for_selector('[data-testid="cluster-west"]')
    assert await tab.text(f'[data-testid="cluster-east"] [data-testid="cluster-free-{H100}"]') == "28"
    assert await tab.text(f'[data-testid="cluster-west"] [data-testid="cluster-free-{A100}"]') == "8"
    # east: rack r0 has two free 8-GPU nodes (room for 2 x 8-GPU replicas), r1 one and a half
    cells = tab.page.locator('[data-testid="cluster-east"] [data-testid="domain"]')
    assert await cells.count() == 2
    assert {await cells.nth(i).get_attribute("data-free") for i in range(2)} == {"16", "12"}
    assert "2" in await tab.text('[data-testid="largest-block-east"]')
    assert "0" in await tab.text('[data-testid="largest-block-west"]')  # 4 free GPUs a node: no 8-GPU replica
    await tab.shot("fleet")
    assert not tab.problems, tab.problems


async def test_a_job_goes_from_queued_to_running_without_a_reload(fleet: Fleet, browser: Any) -> None:
    tab = await _logged_in(browser, fleet, "alpha")
    await tab.page.goto(f"{fleet.base}/#/jobs")
    await tab.page.wait_for_selector(f'[data-testid="job-row-{fleet.waiting}"]')
    await tab.page.wait_for_selector('[data-testid="live"]:text-is("live")')
    await tab.page.evaluate("window.__no_reload_marker = 1")
    job = await _submit(fleet.broker, "alpha", "small", "k1", spec(gpus=8, replicas=2))
    row = f'[data-testid="job-row-{job}"] [data-testid="job-state"]'
    await tab.page.wait_for_selector(row)  # it appears by itself
    await tab.page.wait_for_selector(f'{row}:text-is("RUNNING")', timeout=30_000)
    assert await tab.page.evaluate("window.__no_reload_marker") == 1
    # a running job no longer says why it waits
    assert await tab.page.locator(f'[data-testid="job-row-{job}"] [data-testid="wait-reason"]').count() == 0
    await tab.shot("jobs")
    # its page: the attempt on east, where the cluster put its two replicas
    await tab.page.click(f'[data-testid="job-row-{job}"] [data-testid="job-link"]')
    attempt = tab.page.locator('[data-testid="attempt-1"]')
    await attempt.wait_for()
    text = await attempt.inner_text()
    placed = fleet.east.placed[(job, 1)]
    assert "east" in text and all(b[4] in text for b in placed), (text, placed)
    assert await tab.text('[data-testid="job-state"]') == "RUNNING"
    assert not tab.problems, tab.problems


async def test_a_waiting_job_shows_why_per_cluster_and_can_be_cancelled(fleet: Fleet, browser: Any) -> None:
    tab = await _logged_in(browser, fleet, "alpha")
    await tab.page.goto(f"{fleet.base}/#/jobs/{fleet.waiting}")
    await tab.page.wait_for_selector('[data-testid="job-state"]:text-is("QUEUED")')
    # east could hold it empty but has 28 free; on west no node has 8 free GPUs
    for cluster, reason in (("east", "INSUFFICIENT_CAPACITY"), ("west", "NO_FEASIBLE_NODE")):
        verdict = await tab.text(f'[data-testid="verdict-{cluster}"] [data-testid="verdict-reason"]')
        assert verdict.replace(" ", "_").upper() == reason, (cluster, verdict)
    assert await tab.text('[data-testid="wait-reason"]')
    await tab.shot("job")
    tab.page.once("dialog", lambda d: d.accept())
    await tab.page.click('[data-testid="cancel-job"]')
    await tab.page.wait_for_selector('[data-testid="job-state"]:text-is("CANCELLED")')
    job = await fleet.broker.client("alpha").get(fleet.waiting)
    assert job.status.state == job_pb2.JOB_STATE_CANCELLED
    assert not tab.problems, tab.problems


async def test_queues_page_shows_the_tenant_s_own_row_and_fleet_counts(fleet: Fleet, browser: Any) -> None:
    tab = await _logged_in(browser, fleet, "alpha")
    await tab.page.goto(f"{fleet.base}/#/queues")
    await tab.page.wait_for_selector('[data-testid="tenant-alpha"]')
    assert await tab.page.locator('[data-testid="tenant-beta"]').count() == 0
    await tab.shot("queues")
    assert not tab.problems, tab.problems


async def test_a_tenant_never_sees_another_tenant_s_jobs(fleet: Fleet, browser: Any) -> None:
    tab = await _logged_in(browser, fleet, "alpha")
    await tab.page.goto(f"{fleet.base}/#/jobs")
    await tab.page.wait_for_selector(f'[data-testid="job-row-{fleet.waiting}"]')
    assert await tab.page.locator(f'[data-testid="job-row-{fleet.secret}"]').count() == 0
    await tab.page.goto(f"{fleet.base}/#/jobs/{fleet.secret}")
    await tab.page.wait_for_selector('[data-testid="job-not-found"]')
    assert "beta-secret-set" not in await tab.page.content()
    assert tab.problems == [
        "console error: Failed to load resource: the server responded with a status of 404 (Not Found)"
    ]
    tab.problems.clear()  # the one expected: the API's 404 for a job that is not alpha's
    for path in ("#/jobs", "#/queues", "#/fleet"):
        await tab.page.goto(f"{fleet.base}/{path}")
        await tab.page.wait_for_load_state("networkidle")
        html = await tab.page.content()
        assert fleet.secret not in html and "beta-secret-set" not in html, path
    # the admin sees both, and may cordon
    admin = await _logged_in(browser, fleet, "admin")
    await admin.page.goto(f"{fleet.base}/#/jobs")
    await admin.page.wait_for_selector(f'[data-testid="job-row-{fleet.secret}"]')
    await admin.page.goto(f"{fleet.base}/#/fleet")
    await admin.page.wait_for_selector('[data-testid="cordon-west"]')
    assert await tab.page.locator('[data-testid="cordon-west"]').count() == 0
    assert not tab.problems, tab.problems
