"""Mutating admission webhook that routes every GPU pod to the Tandem scheduler (sets spec.schedulerName).

Routing rule: on Pod CREATE in a configured namespace (all when none are configured), a pod that
asks for a GPU (``nvidia.com/gpu``, ``nvidia.com/mig-*`` or the GPU-share resource in any container
or init container, or any ``spec.resourceClaims``) and still has ``default-scheduler`` gets one
JSONPatch op setting ``spec.schedulerName``. Pods already routed, bound by hand (``nodeName``) or
naming another scheduler on purpose are left alone (the last with a warning).

Failure semantics: the webhook never blocks pod creation. Whatever arrives, it answers HTTP 200 with
``allowed: true``; a review it cannot understand gets no patch and a warning that names the problem
(the API server shows warnings to the client). The MutatingWebhookConfiguration adds
``failurePolicy: Ignore`` and a 2 s timeout, so an outage of this process cannot block the cluster
either: GPU pods created meanwhile keep ``default-scheduler``.

TLS: the API server only calls webhooks over HTTPS. ``add_routes`` mounts the webhook on the main
app (loopback, plain HTTP, used by tests) and, when a webhook listener is configured, starts a
second listener with TLS for the API server; it also serves /healthz and /readyz so kubelet probes
(which reach the pod IP, not loopback) have an endpoint. The certificate and key are files mounted
from a Secret (e.g. issued by cert-manager); they are re-read when they change, so rotation needs
no restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from extender.config import ExtenderConfig, WebhookSettings
from placement.errors import QuantityError
from placement.podspec import GPU_MILLI_RESOURCE, GPU_RESOURCE, MIG_RESOURCE_PREFIX
from placement.quantity import parse_quantity

__all__ = ["WebhookSettings", "add_routes", "review", "wants_gpu", "CertReloader"]

log = logging.getLogger("tandem.extender.webhook")

DEFAULT_SCHEDULER = "default-scheduler"
ADMISSION_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class RoutingConfig(Protocol):
    """The fields of ExtenderConfig the webhook reads."""

    @property
    def scheduler_name(self) -> str: ...

    @property
    def webhook_namespaces(self) -> list[str]: ...


# ---------------------------------------------------------------------------------------- decision


def _positive(value: Any) -> bool:
    if not isinstance(value, (str, int, float)):
        return True  # not a quantity at all: as malformed quantities, route it
    try:
        return parse_quantity(str(value) if isinstance(value, float) else value) > 0
    except (QuantityError, TypeError, ValueError):
        return True  # a malformed quantity still names a GPU resource: route it; the API server validates


def _gpu_resource(name: str) -> bool:
    # The core's names: a pod the webhook routes is one the fit counts (no second, configurable spelling).
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX) or name == GPU_MILLI_RESOURCE


def _containers(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        for c in items if isinstance(items, list) else ():
            if isinstance(c, Mapping):
                yield c


def wants_gpu(pod: Mapping[str, Any], config: RoutingConfig) -> bool:
    """A pod asks for a GPU: a GPU/MIG/GPU-share extended resource in any container, or any resource claim."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    if spec.get("resourceClaims"):
        return True
    for c in _containers(spec):
        resources = c.get("resources")
        if not isinstance(resources, Mapping):
            continue
        for section in ("requests", "limits"):
            amounts = resources.get(section)
            if isinstance(amounts, Mapping) and any(_gpu_resource(str(k)) and _positive(v) for k, v in amounts.items()):
                return True
    return False


def _answer(api_version: str, uid: str, patch: list[dict[str, Any]] | None, warnings: list[str]) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode("ascii")
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def review(body: Any, config: RoutingConfig) -> dict[str, Any]:
    """Answer one decoded AdmissionReview. Pure: no I/O, never raises, always allows."""
    if not isinstance(body, Mapping):
        return _answer(ADMISSION_VERSIONS[0], "", None, ["tandem webhook: body is not an AdmissionReview object"])
    api_version = str(body.get("apiVersion")) if body.get("apiVersion") in ADMISSION_VERSIONS else ADMISSION_VERSIONS[0]
    request = body.get("request")
    if body.get("kind") != "AdmissionReview" or not isinstance(request, Mapping):
        return _answer(api_version, "", None, ["tandem webhook: not an AdmissionReview request; pod left unchanged"])
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return _answer(
            api_version, "", None, ["tandem webhook: AdmissionReview without request.uid; pod left unchanged"]
        )

    kind = request.get("kind") or {}
    if (
        request.get("operation") != "CREATE"
        or not isinstance(kind, Mapping)
        or kind.get("kind") != "Pod"
        or kind.get("group")
    ):
        return _answer(api_version, uid, None, [])
    pod = request.get("object")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        return _answer(api_version, uid, None, ["tandem webhook: request.object is not a Pod; pod left unchanged"])

    # At CREATE the object may have no metadata.namespace yet; the request's namespace is authoritative.
    meta = pod.get("metadata")
    namespace = request.get("namespace") or (meta.get("namespace") if isinstance(meta, Mapping) else None) or ""
    if config.webhook_namespaces and namespace not in config.webhook_namespaces:
        return _answer(api_version, uid, None, [])
    if not wants_gpu(pod, config):
        return _answer(api_version, uid, None, [])

    spec = pod["spec"]
    current = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if not isinstance(current, str):
        return _answer(
            api_version, uid, None, ["tandem webhook: spec.schedulerName is not a string; pod left unchanged"]
        )
    if current == config.scheduler_name or spec.get("nodeName"):
        return _answer(api_version, uid, None, [])  # already routed, or bound by hand: nothing to schedule
    if current != DEFAULT_SCHEDULER:
        # The pod chose another scheduler on purpose (e.g. a batch system's): do not take it away.
        return _answer(
            api_version,
            uid,
            None,
            [f"tandem webhook: GPU pod asks for scheduler {current!r}; not routed to {config.scheduler_name!r}"],
        )
    patch = [{"op": "add", "path": "/spec/schedulerName", "value": config.scheduler_name}]
    return _answer(api_version, uid, patch, [])


# ------------------------------------------------------------------------------------------ serving


def _handler(config: RoutingConfig) -> Callable[[web.Request], Any]:
    async def mutate(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
            log.warning("undecodable admission review", extra={"detail": {"bytes": len(raw)}})
        try:
            answer = review(body, config)
        except Exception:  # a bug here must still not block pod creation: allow, unchanged
            log.exception("admission review failed", extra={"pod": _pod_ref(body)})
            req = body.get("request") if isinstance(body, dict) else None
            uid = req.get("uid") if isinstance(req, dict) else None
            answer = _answer(
                ADMISSION_VERSIONS[0],
                uid if isinstance(uid, str) else "",
                None,
                ["tandem webhook: internal error; pod left unchanged"],
            )
        resp = answer["response"]
        if "patch" in resp or resp.get("warnings"):
            log.info(
                "admission reviewed",
                extra={"pod": _pod_ref(body), "detail": {"patched": "patch" in resp, "warnings": resp.get("warnings")}},
            )
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    return mutate


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _pod_ref(body: Any) -> str | None:
    """`namespace/name` of the reviewed pod for the log, from string fields only, cut to a real key's length."""
    if isinstance(body, Mapping) and isinstance(body.get("request"), Mapping):
        req = body["request"]
        obj: Mapping[str, Any] = req["object"] if isinstance(req.get("object"), Mapping) else {}
        meta: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
        name = _text(req.get("name")) or _text(meta.get("name")) or _text(meta.get("generateName"))
        return f"{_text(req.get('namespace'))}/{name}"[:_REF_MAX]
    return None


_REF_MAX = 63 + 1 + 253


class CertReloader:
    """A server SSLContext whose certificate is re-read when the files change (cert-manager rotation)."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._stamp: tuple[float, float] | None = None
        self.reload()

    def _mtimes(self) -> tuple[float, float]:
        return (self.cert_file.stat().st_mtime, self.key_file.stat().st_mtime)

    def reload(self) -> bool:
        """Load the files if they changed since the last load; True when a new certificate was loaded."""
        stamp = self._mtimes()
        if stamp == self._stamp:
            return False
        # New handshakes use the new chain; a half-written pair fails here and the old one stays.
        self.context.load_cert_chain(str(self.cert_file), str(self.key_file))
        self._stamp = stamp
        return True

    async def watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                if self.reload():
                    log.info("webhook certificate reloaded", extra={"detail": str(self.cert_file)})
            except (OSError, ssl.SSLError) as e:
                log.warning("webhook certificate reload failed", extra={"error": repr(e)})


def _split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def add_routes(
    app: web.Application,
    config: ExtenderConfig,
    settings: WebhookSettings | None = None,
    *,
    ready: Callable[[], bool] | None = None,
) -> None:
    """Mount the webhook on ``app``; with ``settings.listen`` also run the TLS listener for the API server.

    ``settings`` defaults to ``config.webhook`` (the ``webhook_*`` settings, the environment's already applied
    when main() loaded the config). ``ready`` answers the listener's /readyz; by default it is the app's
    inventory readiness.
    """
    settings = settings or config.webhook
    handler = _handler(config)
    app.router.add_post(settings.path, handler)
    listen = settings.listen
    if listen is None:
        return

    async def listener(main_app: web.Application) -> AsyncIterator[None]:
        side = web.Application(client_max_size=settings.max_body_bytes)
        side.router.add_post(settings.path, handler)

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        is_ready = ready or _inventory_readiness(main_app)

        async def readyz(_: web.Request) -> web.Response:
            ok = is_ready()
            return web.Response(text="ready" if ok else "not ready", status=200 if ok else 503)

        side.router.add_get("/healthz", healthz)
        side.router.add_get("/readyz", readyz)
        certs = None
        if settings.tls_cert_file is not None:
            if settings.tls_key_file is None:
                raise ValueError("webhook tls_cert_file is set but tls_key_file is not")
            certs = CertReloader(settings.tls_cert_file, settings.tls_key_file)
        else:
            log.warning("webhook listener without TLS", extra={"detail": listen})
        runner = web.AppRunner(side, access_log=None)
        await runner.setup()
        host, port = _split_listen(listen)
        site = web.TCPSite(runner, host, port, ssl_context=certs.context if certs else None)
        await site.start()
        watcher = asyncio.create_task(certs.watch(settings.cert_check_interval_s)) if certs else None
        main_app[LISTENER_KEY] = runner
        if certs is not None:
            main_app[CERTS_KEY] = certs
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await runner.cleanup()

    app.cleanup_ctx.append(listener)


LISTENER_KEY = web.AppKey("tandem_webhook_listener", web.AppRunner)
CERTS_KEY = web.AppKey("tandem_webhook_certs", CertReloader)


def _inventory_readiness(app: web.Application) -> Callable[[], bool]:
    """Readiness of the extender app's inventory (synced and reservations loaded)."""
    from extender.app import INVENTORY_KEY  # at startup only: app.py never imports this module

    inventory = app.get(INVENTORY_KEY)
    if inventory is None:
        return lambda: True
    return lambda: bool(inventory.ready)
