"""The aiohttp application kube-scheduler calls: filter / prioritize / preempt, probes and metrics."""

from __future__ import annotations

import collections
import itertools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from extender import decide, protocol
from extender.config import ExtenderConfig
from extender.errors import ExtenderError, UndecodableBody
from extender.inventory import Inventory

__all__ = ["make_app", "Metrics", "RecentDecisions", "ssl_context", "INVENTORY_KEY", "METRICS_KEY", "DECISIONS_KEY"]

log = logging.getLogger("tandem.extender")

INVENTORY_KEY = web.AppKey("inventory", Inventory)
CONFIG_KEY = web.AppKey("config", ExtenderConfig)


class Metrics:
    """Prometheus metrics of one app, in a registry of its own (tests build many apps)."""

    def __init__(self, inv: Inventory, clock: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "tandem_extender_request_seconds",
            "Extender request latency by verb.",
            ["verb"],
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
            registry=self.registry,
        )
        self.decisions = Counter(
            "tandem_extender_decisions_total",
            "Per-node outcomes of extender requests by verb and reason.",
            ["verb", "reason"],
            registry=self.registry,
        )
        self.errors = Counter(
            "tandem_extender_request_errors_total",
            "Requests answered with an error, by verb and kind.",
            ["verb", "kind"],
            registry=self.registry,
        )
        age = Gauge(
            "tandem_extender_inventory_age_seconds", "Seconds since the inventory last changed.", registry=self.registry
        )
        age.set_function(lambda: max(clock() - inv.last_change, 0.0))
        ver = Gauge(
            "tandem_extender_inventory_version", "Inventory version (bumps on every change).", registry=self.registry
        )
        ver.set_function(lambda: float(inv.version))
        ready = Gauge(
            "tandem_extender_ready",
            "1 once the inventory is synced and reservations are loaded.",
            registry=self.registry,
        )
        ready.set_function(lambda: 1.0 if inv.ready else 0.0)


METRICS_KEY = web.AppKey("metrics", Metrics)


class RecentDecisions:
    """The last decisions per verb, newest first: what the agent streams to the broker and what
    `GET /debug/decisions?pod=ns/name` shows when a pod does not schedule."""

    def __init__(self, clock: Callable[[], float], maxlen: int = 1000) -> None:
        self._clock = clock
        self._items: collections.deque[dict[str, Any]] = collections.deque(maxlen=maxlen)

    def record(self, verb: str, pod: str | None, decision: decide.Decision) -> None:
        self._items.appendleft(
            {
                "time": self._clock(),
                "verb": verb,
                "pod": pod,
                "passed": decision.passed,
                "reasons": dict(decision.reasons),
            }
        )

    def recent(self, pod: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return [d for d in self._items if pod is None or d["pod"] == pod][:limit]


DECISIONS_KEY = web.AppKey("decisions", RecentDecisions)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


_POD_KEY_MAX = 63 + 1 + 253
"""namespace/name at the API's own length limits: what the recent decisions keep of a pod's key."""


def _pod_name(pod: Any) -> str | None:
    """`namespace/name` of a decoded pod, from string fields only, cut to a real pod key's length."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(meta, dict):
        return None
    ns, name = meta.get("namespace"), meta.get("name")
    return f"{ns if isinstance(ns, str) else ''}/{name if isinstance(name, str) else ''}"[:_POD_KEY_MAX]


class _VerbArgs(Protocol):
    """What every decoded verb body has (protocol.ExtenderArgs, protocol.PreemptionArgs)."""

    @property
    def pod(self) -> dict[str, Any]: ...


_Args = TypeVar("_Args", bound=_VerbArgs)


def make_app(
    inventory: Inventory,
    config: ExtenderConfig | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    extra_routes: Callable[[web.Application, ExtenderConfig], None] | None = None,
) -> web.Application:
    """The extender app. extra_routes mounts more on it: main() passes webhook.add_routes (app.py never imports
    the webhook), which reads its settings from the config it is handed."""
    cfg = config or inventory.config
    app = web.Application(client_max_size=cfg.max_body_bytes)
    metrics = Metrics(inventory, clock)
    app[INVENTORY_KEY] = inventory
    app[CONFIG_KEY] = cfg
    app[METRICS_KEY] = metrics
    decisions = RecentDecisions(time.time)
    app[DECISIONS_KEY] = decisions
    ids = itertools.count(1)

    def verb_handler(
        verb: str,
        parse: Callable[[bytes], _Args],
        run: Callable[[Inventory, _Args], decide.Decision],
        on_error: Callable[[str], bytes],
    ) -> Handler:
        hist = metrics.latency.labels(verb)

        async def handle(request: web.Request) -> web.StreamResponse:
            t0 = time.perf_counter()
            did = next(ids)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                metrics.errors.labels(verb, "too_large").inc()
                log.warning("request body too large", extra={"verb": verb, "decision_id": did})
                raise
            pod = None
            try:
                args = parse(body)
                pod = _pod_name(args.pod)
                d = run(inventory, args)
                decisions.record(verb, pod, d)
                out = d.body
                if d.reasons:
                    for reason, n in d.reasons.items():
                        metrics.decisions.labels(verb, reason).inc(n)
                if d.passed:
                    metrics.decisions.labels(verb, "Fit").inc(d.passed)
            except UndecodableBody as e:
                metrics.errors.labels(verb, "undecodable").inc()
                log.warning("undecodable request", extra={"verb": verb, "decision_id": did, "error": str(e)})
                hist.observe(time.perf_counter() - t0)
                return _json(on_error(str(e)), status=400)
            except ExtenderError as e:
                metrics.errors.labels(verb, type(e).__name__).inc()
                log.warning("request refused", extra={"verb": verb, "decision_id": did, "pod": pod, "error": str(e)})
                out = on_error(str(e))
            except Exception as e:  # never crash kube-scheduler's call: answer with Error
                metrics.errors.labels(verb, "internal").inc()
                log.exception("request failed", extra={"verb": verb, "decision_id": did, "pod": pod})
                out = on_error(f"internal error: {type(e).__name__}: {e}")
            dt = time.perf_counter() - t0
            hist.observe(dt)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "request answered",
                    extra={"verb": verb, "decision_id": did, "pod": pod, "duration_ms": round(dt * 1000, 3)},
                )
            return _json(out)

        return handle

    def _prio_error(msg: str) -> bytes:
        del msg  # HostPriorityList has no Error field: an empty list means "no opinion"
        return b"[]"

    app.router.add_post(
        cfg.verb_path(cfg.filter_verb),
        verb_handler("filter", protocol.parse_extender_args, decide.decide_filter, protocol.encode_filter_error),
    )
    app.router.add_post(
        cfg.verb_path(cfg.prioritize_verb),
        verb_handler("prioritize", protocol.parse_extender_args, decide.decide_prioritize, _prio_error),
    )
    app.router.add_post(
        cfg.verb_path(cfg.preempt_verb),
        verb_handler(
            "preempt", protocol.parse_preemption_args, decide.decide_preempt, protocol.encode_preemption_error
        ),
    )

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if inventory.ready:
            return web.Response(text="ready")
        missing = []
        if not inventory.synced:
            missing.append("inventory not synced")
        if not inventory.reservations_loaded:
            missing.append("reservations not loaded")
        return web.Response(text="; ".join(missing), status=503)

    async def metrics_view(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def recent_decisions(request: web.Request) -> web.Response:
        try:
            limit = min(int(request.query.get("limit", "50")), 1000)
        except ValueError:
            return web.Response(status=400, text="limit must be an integer")
        return web.json_response(decisions.recent(request.query.get("pod"), limit), dumps=_dumps)

    app.router.add_get("/debug/decisions", recent_decisions)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
    if extra_routes is not None:
        extra_routes(app, cfg)
    return app


def ssl_context(config: ExtenderConfig) -> ssl.SSLContext | None:
    """Server TLS context from the configured cert/key, None for plain HTTP."""
    if config.tls_cert_file is None:
        return None
    if config.tls_key_file is None:
        raise ValueError("tls_cert_file is set but tls_key_file is not")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(config.tls_cert_file), str(config.tls_key_file))
    return ctx
