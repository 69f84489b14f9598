"""The bounds on what a tenant sends: sizes, counts and numeric ranges, each a name the checks and their messages use.

Numbers are bounded where they reach the store (SQLite / PostgreSQL integers are 64-bit) or arithmetic.
"""

from __future__ import annotations

__all__ = [
    "MAX_ITEMS",
    "MAX_JOB_ID",
    "MAX_POD_SET_NAME",
    "MAX_KEY",
    "MAX_TEMPLATE_BYTES",
    "MAX_SPEC_BYTES",
    "MAX_REASON",
    "MAX_NAME",
    "MAX_SUBDOMAIN",
    "MAX_DISPLAY_NAME",
    "MAX_JSON_DEPTH",
    "MAX_POD_SETS",
    "MAX_REPLICAS",
    "MAX_SELECTOR_ENTRIES",
    "MAX_PAGE_TOKEN",
    "MAX_WATCH_JOB_IDS",
    "MAX_BOOKMARK_S",
    "MAX_REVISION",
    "MAX_DURATION_S",
    "MAX_INFRA_RETRIES",
    "MAX_GPU_MEMORY_MIB",
    "MAX_CPU_MILLI",
    "MAX_MEMORY_BYTES",
    "MAX_EXTENDED_AMOUNT",
    "MAX_MIG_COUNT",
    "MAX_DEVICE_REQUESTS",
    "MAX_SELECTORS",
    "MAX_SELECTOR_BYTES",
    "MAX_SELECTORS_TOTAL_BYTES",
    "MAX_DEVICE_COUNT",
    "MAX_ANNOTATIONS_BYTES",
    "MAX_NAMES",
    "MAX_TIMESTAMP_S",
    "MAX_PRIORITY",
]

MAX_ITEMS = 1000
MAX_JOB_ID = 40
MAX_POD_SET_NAME = 12
MAX_KEY = 128
MAX_TEMPLATE_BYTES = 256 * 1024
MAX_SPEC_BYTES = 1536 * 1024
"""A whole JobSpec, serialized: what etcd keeps of one object (the agent renders the templates into Jobs), and
small enough that any one job fits in a response (ListJobs pages are cut by size, never below one job)."""
MAX_REASON = 1024
MAX_NAME = 63
"""DNS-1123 labels and label values (queues, tenants, bands, regions, roles, GPU models)."""
MAX_SUBDOMAIN = 253
MAX_DISPLAY_NAME = 253
MAX_JSON_DEPTH = 64
"""Nesting levels of a pod template (real PodTemplateSpecs stay near 12); deeper is refused before json.loads."""
MAX_POD_SETS = 64
MAX_REPLICAS = 99_999
"""Per pod set (pod hostnames must fit in 63) and for the whole job."""
MAX_SELECTOR_ENTRIES = 64
"""ListJobs label_selector pairs (each is one SQL condition)."""
MAX_PAGE_TOKEN = 512
MAX_WATCH_JOB_IDS = 1000
MAX_BOOKMARK_S = 3600
MAX_REVISION = (1 << 63) - 1
"""Store revisions are 64-bit signed integers."""
MAX_DURATION_S = 10 * 365 * 86400
"""Ten years: runtimes, start timeouts and grace periods beyond this are mistakes, and they become deadlines."""
MAX_INFRA_RETRIES = 1000
MAX_GPU_MEMORY_MIB = 1 << 24
MAX_CPU_MILLI = 10**9
MAX_MEMORY_BYTES = 1 << 50
MAX_EXTENDED_AMOUNT = 10**9
MAX_MIG_COUNT = 7 * 64
MAX_DEVICE_REQUESTS = 32
"""Kubernetes' own limits for a ResourceClaim: 32 requests, 32 selectors each, 10 KiB per CEL expression; the
DRA device count is bounded by its 32 allocation results."""
MAX_SELECTORS = 32
MAX_SELECTOR_BYTES = 10 * 1024
MAX_SELECTORS_TOTAL_BYTES = 64 * 1024
"""All selectors of one job: each compiles once at submission and is evaluated per device at placement."""
MAX_DEVICE_COUNT = 32
MAX_ANNOTATIONS_BYTES = 256 * 1024
"""Kubernetes' limit on the total size of an object's annotations."""
MAX_NAMES = 256
"""Entries of a cluster selector or data-locality list, GPU models of a shape."""
MAX_TIMESTAMP_S = 253_402_300_799
"""9999-12-31T23:59:59Z: the largest google.protobuf.Timestamp."""
MAX_PRIORITY = 1000
"""JobSpec.priority and SetJobPriority lie in -MAX_PRIORITY..MAX_PRIORITY."""
