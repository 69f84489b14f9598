"""Contract tests of a Kubernetes API server: the fake in sim/kubeapi, and a real cluster when one is given."""
