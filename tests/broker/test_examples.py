"""The example files the README points newcomers at stay loadable and mean what they say."""

from pathlib import Path

from broker.launcher import jobfile
from broker.tenancy import policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_policy_maps_dev_tokens_to_tenant_and_admin() -> None:
    pol = policy.parse_policy((EXAMPLES / "policy.yaml").read_text())
    research = pol.tenants["research"]
    assert research.token_sha256 == [policy.hash_token("research-dev-token")]
    assert pol.doc.admins.token_sha256 == [policy.hash_token("admin-dev-token")]
    assert research.quota_for("NVIDIA-H100-80GB-HBM3") == 256
    assert research.quota_for("NVIDIA-L40S") == 64
    assert not pol.tenants["inference"].allows_cluster("us-east-a")


def test_example_job_file_maps_to_a_rack_bound_gang() -> None:
    spec = jobfile.to_spec(jobfile.load_job_file(EXAMPLES / "job-torchrun-rack.yaml"))
    assert [(ps.name, ps.count) for ps in spec.pod_sets] == [("workers", 4)]
    shape = spec.pod_sets[0].shape
    assert (shape.gpu_count, list(shape.allowed_gpu_models)) == (8, ["NVIDIA-H100-80GB-HBM3"])
    assert spec.topology.required_level == "rack"
