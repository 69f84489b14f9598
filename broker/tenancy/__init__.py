"""Who may do what: the tenancy policy, the callers it authenticates (agent, tenant, admin) with their
audit trail, and the Pod Security Standards a tenant's pod template is held to.

Builds on the domain only; no protobuf, no store.
"""
