"""The cluster agent: streams the cluster's inventory to the broker and runs the workloads it dispatches."""
