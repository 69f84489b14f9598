"""Every check on what a tenant sends, each violation naming the field path: the entry the API room calls.

The checks live where their names say: ``validation_fields`` (every request's
and JobSpec's fields), ``validation_templates`` (the untrusted pod template
rules and the reserved label / annotation domains), ``validation_enums``
(enum numbers no enum defines) and ``validation_limits`` (the bounds).
"""

from __future__ import annotations

# the servicers, handlers and serde call these as `validation.<name>`: one entry, wherever the code lives
# (each name is re-exported by its redundant alias, so it is listed once)
from broker.api.validation_enums import unknown_enums as unknown_enums
from broker.api.validation_fields import check_cancel_job as check_cancel_job
from broker.api.validation_fields import check_cancel_job_set as check_cancel_job_set
from broker.api.validation_fields import check_cluster_request as check_cluster_request
from broker.api.validation_fields import check_export_usage as check_export_usage
from broker.api.validation_fields import check_get_usage as check_get_usage
from broker.api.validation_fields import check_job_id as check_job_id
from broker.api.validation_fields import check_job_request as check_job_request
from broker.api.validation_fields import check_key as check_key
from broker.api.validation_fields import check_list_clusters as check_list_clusters
from broker.api.validation_fields import check_list_jobs as check_list_jobs
from broker.api.validation_fields import check_set_job_priority as check_set_job_priority
from broker.api.validation_fields import check_spec as check_spec
from broker.api.validation_fields import check_submit as check_submit
from broker.api.validation_fields import check_watch_jobs as check_watch_jobs
from broker.api.validation_fields import raise_if as raise_if
from broker.api.validation_templates import check_json_depth as check_json_depth
from broker.api.validation_templates import check_pod_template as check_pod_template
from broker.api.validation_templates import check_untrusted as check_untrusted
from broker.api.validation_templates import reserved_key as reserved_key
