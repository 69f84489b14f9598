"""Every check on what a tenant sends, each violation naming the field path: the entry the API room calls.

The checks live where their names say: ``validation_fields`` (every request's
and JobSpec's fields), ``validation_templates`` (the untrusted pod template
rules and the reserved label / annotation domains), ``validation_enums``
(enum numbers no enum defines) and ``validation_limits`` (the bounds).
"""

from __future__ import annotations

from broker.api.validation_enums import unknown_enums
from broker.api.validation_fields import (
    DNS1035,
    check_cancel_job,
    check_cancel_job_set,
    check_cluster_request,
    check_export_usage,
    check_get_usage,
    check_job_id,
    check_job_request,
    check_key,
    check_list_clusters,
    check_list_jobs,
    check_set_job_priority,
    check_spec,
    check_submit,
    check_text,
    check_watch_jobs,
    raise_if,
)
from broker.api.validation_limits import MAX_ITEMS
from broker.api.validation_templates import (
    RESERVED_DOMAINS,
    check_json_depth,
    check_pod_template,
    check_untrusted,
    json_depth,
    reserved_key,
)

# the servicers, handlers and serde call these as `validation.<name>`: one entry, wherever the code lives
__all__ = [
    "DNS1035",
    "check_job_id",
    "check_submit",
    "check_key",
    "check_spec",
    "check_pod_template",
    "check_untrusted",
    "RESERVED_DOMAINS",
    "reserved_key",
    "check_text",
    "check_list_jobs",
    "check_watch_jobs",
    "check_cancel_job",
    "check_cancel_job_set",
    "check_job_request",
    "check_get_usage",
    "check_export_usage",
    "check_set_job_priority",
    "check_list_clusters",
    "check_cluster_request",
    "check_json_depth",
    "json_depth",
    "unknown_enums",
    "raise_if",
    "MAX_ITEMS",
]
