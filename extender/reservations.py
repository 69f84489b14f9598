"""Gang reservations as the agent records them in the cluster: a ConfigMap format, parsed in one place.

A reservation holds GPUs on named nodes for a gang that the broker dispatched here but that has not
fully started. The agent writes it before creating the workload and deletes it when the attempt
ends (started, timed out, cancelled); the extender loads every one before it reports ready.

Format (ConfigMap in the configured namespace, labelled ``tandem.dev/reservation: "true"``)::

    data:
      job: train-42                       # value of the pods' tandem.dev/job label
      attempt: "3"                        # value of the pods' tandem.dev/attempt label
      nodes: '{"h100-r7-n1": 2, "h100-r7-n2": 2}'   # replicas assigned per node (JSON object)
      shape: '{"gpus": 2, "cpu": "8", "memory": "64Gi", "mig": {"3g.40gb": 1}}'  # one replica
      domain: 'network.example.com/rack=r7'         # optional: the domain, for messages

Each bound replica of (job, attempt) on a node consumes one of that node's reserved replicas, so
the part still held is ``reserved - bound`` (never below 0); nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extender.errors import InventoryError
from placement.quantity import QuantityError, cpu_milli, to_int_bytes

__all__ = ["Reservation", "parse_reservation", "ReservationShape", "domain_label"]


class ReservationShape(BaseModel):
    """One replica of a reservation (the JSON in data.shape)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    gpus: int = Field(0, ge=0)
    """Whole GPUs per replica."""
    cpu: str | int = 0
    """CPU per replica, a Kubernetes quantity."""
    memory: str | int = 0
    """Memory per replica, a Kubernetes quantity."""
    mig: dict[str, int] = Field(default_factory=dict)
    """MIG instances per replica, by profile name ("3g.40gb")."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A parsed reservation: per-node replica counts and the per-replica shape."""

    key: tuple[str, str]
    job: str
    attempt: str
    nodes: dict[str, int]
    gpus: int
    cpu_milli: int
    memory: int
    mig: tuple[tuple[str, int], ...]
    domain: str

    @property
    def gang(self) -> tuple[str, str]:
        return (self.job, self.attempt)

    @property
    def domain_label(self) -> str:
        """"network.example.com/rack=r7" -> "rack r7" (for messages); other text as written."""
        return domain_label(self.domain)


def domain_label(domain: str) -> str:
    key, sep, value = domain.partition("=")
    if not sep:
        return domain
    return f"{key.rsplit('/', 1)[-1]} {value}"


def parse_reservation(cm: dict[str, Any]) -> Reservation:
    """ConfigMap -> Reservation; raises InventoryError naming the bad field."""
    meta = cm.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    data = cm.get("data") or {}
    try:
        job = data["job"]
        attempt = str(data.get("attempt", ""))
        nodes_raw = orjson.loads(data["nodes"])
        shape = ReservationShape.model_validate(orjson.loads(data.get("shape", "{}")))
        if not isinstance(job, str) or not job:
            raise InventoryError(f"reservation {key[1]}: data.job must be a non-empty string")
        if not isinstance(nodes_raw, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in nodes_raw.items()
        ):
            raise InventoryError(f"reservation {key[1]}: data.nodes must map node names to replica counts")
        return Reservation(
            key=key,
            job=job,
            attempt=attempt,
            nodes=dict(nodes_raw),
            gpus=shape.gpus,
            cpu_milli=cpu_milli(shape.cpu),
            memory=to_int_bytes(shape.memory),
            mig=tuple(sorted(shape.mig.items())),
            domain=str(data.get("domain", "")),
        )
    except KeyError as e:
        raise InventoryError(f"reservation {key[1]}: data.{e.args[0]} is missing") from e
    except (orjson.JSONDecodeError, ValidationError, QuantityError, ValueError) as e:
        if isinstance(e, InventoryError):
            raise
        raise InventoryError(f"reservation {key[1]}: {e}") from e
