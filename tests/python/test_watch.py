"""Watch streams through `kubernetes.watch.Watch`, including its 410 behaviour after the
simulator compacts its history."""

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from helpers import job, pod


def test_watch_sees_added_modified_deleted(core, ns):
    start_rv = core.list_namespaced_pod(ns).metadata.resource_version
    core.create_namespaced_pod(ns, pod("w", {"kjob.io/sim-run-time": "200ms"}))
    w = watch.Watch()
    types = []
    phases = []
    delete_sent = False
    for ev in w.stream(core.list_namespaced_pod, ns, resource_version=start_rv, timeout_seconds=15):
        assert isinstance(ev["object"], client.V1Pod), "events deserialise to typed pods"
        types.append(ev["type"])
        phases.append(ev["object"].status.phase)
        if ev["object"].status.phase == "Succeeded" and not delete_sent:
            core.delete_namespaced_pod("w", ns)
            delete_sent = True
        if ev["type"] == "DELETED":
            w.stop()
    assert types[0] == "ADDED"
    assert "MODIFIED" in types
    assert types[-1] == "DELETED"
    assert "Running" in phases and "Succeeded" in phases


def test_watch_with_label_selector_sees_transitions(batch, ns):
    batch.create_namespaced_job(ns, job("sel", labels={"stage": "a"}))
    rv = batch.list_namespaced_job(ns).metadata.resource_version
    batch.patch_namespaced_job("sel", ns, {"metadata": {"labels": {"stage": "b"}}})
    batch.patch_namespaced_job("sel", ns, {"metadata": {"labels": {"stage": "a"}}})
    w = watch.Watch()
    seen = []
    for ev in w.stream(batch.list_namespaced_job, ns, label_selector="stage=a", resource_version=rv,
                       timeout_seconds=5):
        seen.append(ev["type"])
        if len(seen) == 2:
            w.stop()
    assert seen == ["DELETED", "ADDED"]


def test_expired_resource_version_raises_410_with_timeout(sim, batch, ns):
    old_rv = batch.list_namespaced_job(ns).metadata.resource_version
    for i in range(3):
        batch.create_namespaced_job(ns, job(f"c{i}"))
    sim.hook("compact")
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(batch.list_namespaced_job, ns, resource_version=old_rv, timeout_seconds=5):
            pytest.fail("no event may arrive from a compacted revision")
    assert gone.value.status == 410
    assert gone.value.reason.startswith("Expired: too old resource version")


def test_expired_resource_version_retries_once_then_raises(sim, batch, ns):
    old_rv = batch.list_namespaced_job(ns).metadata.resource_version
    batch.create_namespaced_job(ns, job("x"))
    sim.hook("compact")
    # Without timeout_seconds the client re-watches once from the same revision; the second
    # 410 is raised to the caller.
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(batch.list_namespaced_job, ns, resource_version=old_rv):
            pytest.fail("no event may arrive from a compacted revision")
    assert gone.value.status == 410
    # Recovery: relist and watch from the new revision.
    fresh = batch.list_namespaced_job(ns)
    assert [j.metadata.name for j in fresh.items] == ["x"]
    batch.create_namespaced_job(ns, job("y"))
    w = watch.Watch()
    for ev in w.stream(batch.list_namespaced_job, ns, resource_version=fresh.metadata.resource_version,
                       timeout_seconds=5):
        assert ev["type"] == "ADDED" and ev["object"].metadata.name == "y"
        w.stop()
