"""Pods driven by the simulated kubelet, read back through the typed client (which
validates required fields such as containerStatuses[].imageID while deserialising)."""

import re

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from helpers import pod, wait_for


def phase_of(core, ns, name):
    try:
        p = core.read_namespaced_pod(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return p.status.phase


def test_pod_defaults(core, ns):
    created = core.create_namespaced_pod(ns, pod("defaults", {"kjob.io/sim-run-time": "never"}))
    spec = created.spec
    assert spec.dns_policy == "ClusterFirst"
    assert spec.scheduler_name == "default-scheduler"
    assert spec.termination_grace_period_seconds == 30
    assert spec.enable_service_links is True
    assert spec.service_account_name == "default"
    assert spec.priority == 0
    assert {t.key for t in spec.tolerations} >= {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert spec.containers[0].image_pull_policy == "Always"
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "BestEffort"


def test_every_kubelet_stage_deserialises(core, ns):
    core.create_namespaced_pod(ns, pod("ok", {"kjob.io/sim-run-time": "300ms"}, containers=("a", "b")))
    core.create_namespaced_pod(ns, pod("bad", {"kjob.io/sim-run-time": "300ms", "kjob.io/sim-exit-code.b": "42"},
                                       containers=("a", "b")))
    seen_phases = set()

    def done():
        # Typed reads at every stage: Pending, Running, then terminal.
        p = core.read_namespaced_pod("ok", ns)
        seen_phases.add(p.status.phase)
        return p if p.status.phase == "Succeeded" else None

    ok = wait_for("pod ok to succeed", done, interval=0.02)
    assert "Running" in seen_phases or "Pending" in seen_phases
    # kjob-sim names its nodes sim-node-N, kjob-node-agent kjob-node-N.
    assert re.fullmatch(r"(sim|kjob)-node-[0-9]+", ok.spec.node_name)
    assert ok.status.pod_ip and ok.status.pod_i_ps[0].ip == ok.status.pod_ip
    assert ok.status.host_ip and ok.status.start_time is not None
    for cs in ok.status.container_statuses:
        assert "@sha256:" in cs.image_id
        assert cs.container_id.startswith("containerd://")
        assert cs.state.terminated.exit_code == 0
        assert cs.state.terminated.reason == "Completed"
        assert cs.state.terminated.started_at is not None and cs.state.terminated.finished_at is not None
    conds = {c.type: c for c in ok.status.conditions}
    assert set(conds) >= {"PodScheduled", "Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers"}
    assert conds["Ready"].status == "False" and conds["Ready"].reason == "PodCompleted"

    bad = wait_for("pod bad to fail", lambda: (lambda p: p if p.status.phase == "Failed" else None)(
        core.read_namespaced_pod("bad", ns)))
    codes = {cs.name: cs.state.terminated.exit_code for cs in bad.status.container_statuses}
    assert codes == {"a": 0, "b": 42}

    listed = core.list_namespaced_pod(ns)
    assert isinstance(listed, client.V1PodList)
    assert {p.metadata.name for p in listed.items} == {"ok", "bad"}


def test_on_failure_restarts(core, ns):
    core.create_namespaced_pod(ns, pod("crash", {"kjob.io/sim-run-time": "200ms", "kjob.io/sim-exit-code": "3"},
                                       restart_policy="OnFailure"))
    p = wait_for("a restart", lambda: (lambda p: p if p.status.container_statuses and
                                       p.status.container_statuses[0].restart_count >= 1 else None)(
        core.read_namespaced_pod("crash", ns)))
    cs = p.status.container_statuses[0]
    assert p.status.phase == "Running"
    assert cs.last_state.terminated.exit_code == 3


def test_graceful_delete_removes_running_pod(core, ns):
    core.create_namespaced_pod(ns, pod("del", {"kjob.io/sim-run-time": "never"}))
    wait_for("running", lambda: phase_of(core, ns, "del") == "Running")
    # Options as query parameters with no body, as this client sends them.
    core.delete_namespaced_pod("del", ns, grace_period_seconds=30)
    wait_for("removal", lambda: phase_of(core, ns, "del") is None)


def test_strategic_merge_patch_on_pod_finalizers(core, ns):
    p = pod("fin", {"kjob.io/sim-run-time": "never"})
    p.metadata.finalizers = ["example.com/a", "batch.kubernetes.io/job-tracking"]
    core.create_namespaced_pod(ns, p)
    core.patch_namespaced_pod("fin", ns, {"metadata": {
        "$deleteFromPrimitiveList/finalizers": ["batch.kubernetes.io/job-tracking"]}})
    assert core.read_namespaced_pod("fin", ns).metadata.finalizers == ["example.com/a"]
    core.patch_namespaced_pod("fin", ns, {"metadata": {"finalizers": ["example.com/b"]}})
    # A real server puts patch items in front of server-only ones (normalizeElementOrder).
    assert core.read_namespaced_pod("fin", ns).metadata.finalizers == ["example.com/b", "example.com/a"]
    core.patch_namespaced_pod("fin", ns, [{"op": "remove", "path": "/metadata/finalizers"}])
    core.delete_namespaced_pod("fin", ns, grace_period_seconds=0)
    wait_for("removal", lambda: phase_of(core, ns, "fin") is None)


def test_eviction_hook_adds_disruption_target(sim, core, ns):
    p = pod("victim", {"kjob.io/sim-run-time": "never"})
    p.metadata.finalizers = ["example.com/hold"]
    core.create_namespaced_pod(ns, p)
    wait_for("running", lambda: phase_of(core, ns, "victim") == "Running")
    core.create_namespaced_pod_eviction("victim", ns, client.V1Eviction(
        metadata=client.V1ObjectMeta(name="victim", namespace=ns)))
    evicted = wait_for("failed", lambda: (lambda p: p if p.status.phase == "Failed" else None)(
        core.read_namespaced_pod("victim", ns)))
    dt = next(c for c in evicted.status.conditions if c.type == "DisruptionTarget")
    assert dt.status == "True" and dt.reason == "EvictionByEvictionAPI"
    assert evicted.metadata.deletion_timestamp is not None
    core.patch_namespaced_pod("victim", ns, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/hold"]}})
    wait_for("removal", lambda: phase_of(core, ns, "victim") is None)


def test_invalid_pod_is_422(core, ns):
    with pytest.raises(ApiException) as bad:
        core.create_namespaced_pod(ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name="nope"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="Bad_Name", image="x")])))
    assert bad.value.status == 422
