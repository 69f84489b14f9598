"""A local Kubernetes API server for tests and the simulator (JSON over HTTP on 127.0.0.1).

It speaks the real REST protocol for the resources Tandem touches, with the behaviour that
keeps client code honest: one global resourceVersion, list/watch with resume, compaction
(410), bookmarks and per-watch delivery delay; status and binding subresources; defaulting,
validation and admission (priority, quota, LimitRange); the three patch types; finalizers,
graceful pod deletion and a garbage collector; bearer tokens and RBAC loaded from manifests.
"""

from __future__ import annotations

from sim.kubeapi.kubeconfig import write_kubeconfig
from sim.kubeapi.server import KubeAPIServer

__all__ = ["KubeAPIServer", "write_kubeconfig"]
