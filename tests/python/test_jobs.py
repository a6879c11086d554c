"""Jobs through the official client: defaulting, selectors, every patch flavour, 422s."""

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from helpers import job


def test_create_applies_server_defaults_and_generated_labels(batch, ns):
    created = batch.create_namespaced_job(ns, job("pi"))
    got = batch.read_namespaced_job("pi", ns)
    uid = got.metadata.uid
    assert uid and uid == created.metadata.uid
    spec = got.spec
    assert (spec.parallelism, spec.completions, spec.backoff_limit) == (1, 1, 6)
    assert spec.completion_mode == "NonIndexed"
    assert spec.suspend is False and spec.manual_selector is False
    assert spec.pod_replacement_policy == "TerminatingOrFailed"
    assert spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    expected = {
        "batch.kubernetes.io/controller-uid": uid,
        "controller-uid": uid,
        "batch.kubernetes.io/job-name": "pi",
        "job-name": "pi",
    }
    assert spec.template.metadata.labels == expected
    assert got.metadata.labels == expected
    pod_spec = spec.template.spec
    assert pod_spec.dns_policy == "ClusterFirst"
    assert pod_spec.scheduler_name == "default-scheduler"
    assert pod_spec.termination_grace_period_seconds == 30
    c = pod_spec.containers[0]
    assert c.termination_message_path == "/dev/termination-log"
    assert c.termination_message_policy == "File"
    assert c.image_pull_policy == "IfNotPresent"
    assert got.metadata.generation == 1


def test_work_queue_job_keeps_completions_unset(batch, ns):
    batch.create_namespaced_job(ns, job("wq", parallelism=3))
    got = batch.read_namespaced_job("wq", ns)
    assert got.spec.parallelism == 3
    assert got.spec.completions is None


def test_list_with_label_and_field_selectors(batch, ns):
    batch.create_namespaced_job(ns, job("a1", labels={"app": "a", "tier": "x"}))
    batch.create_namespaced_job(ns, job("a2", labels={"app": "a"}))
    batch.create_namespaced_job(ns, job("b1", labels={"app": "b"}))

    def names(**kw):
        return sorted(j.metadata.name for j in batch.list_namespaced_job(ns, **kw).items)

    assert names() == ["a1", "a2", "b1"]
    assert names(label_selector="app=a") == ["a1", "a2"]
    assert names(label_selector="app in (a,b),tier") == ["a1"]
    assert names(label_selector="app!=a") == ["b1"]
    assert names(label_selector="!tier") == ["a2", "b1"]
    assert names(field_selector="metadata.name=b1") == ["b1"]
    assert names(field_selector="metadata.name!=b1,status.successful=0") == ["a1", "a2"]
    listed = batch.list_namespaced_job(ns)
    assert listed.metadata.resource_version

    with pytest.raises(ApiException) as bad:
        batch.list_namespaced_job(ns, label_selector="app in a")
    assert bad.value.status == 400
    with pytest.raises(ApiException) as unsupported:
        batch.list_namespaced_job(ns, field_selector="spec.foo=bar")
    assert unsupported.value.status == 400
    assert 'field label "spec.foo" not supported for Job' in json.loads(unsupported.value.body)["message"]


def test_patch_flavours(api_client, batch, ns):
    batch.create_namespaced_job(ns, job("p", labels={"keep": "yes"}))

    # A dict body is sent as a strategic merge patch.
    batch.patch_namespaced_job("p", ns, {"metadata": {"labels": {"smp": "1"}}, "spec": {"parallelism": 2}})
    got = batch.read_namespaced_job("p", ns)
    assert got.metadata.labels == {"keep": "yes", "smp": "1"}
    assert got.spec.parallelism == 2
    assert got.metadata.generation == 2

    # A list body is sent as a JSON patch; `test` of a missing key against null succeeds.
    batch.patch_namespaced_job("p", ns, [
        {"op": "test", "path": "/metadata/finalizers", "value": None},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/x"]},
        {"op": "replace", "path": "/spec/parallelism", "value": 3},
    ])
    got = batch.read_namespaced_job("p", ns)
    assert got.metadata.finalizers == ["example.com/x"]
    assert got.spec.parallelism == 3

    # A failing JSON patch test is a 422.
    with pytest.raises(ApiException) as failed:
        batch.patch_namespaced_job("p", ns, [{"op": "test", "path": "/spec/parallelism", "value": 9}])
    assert failed.value.status == 422

    # Merge patch: lists are replaced, null deletes.
    path = f"/apis/batch/v1/namespaces/{ns}/jobs/p"
    merged, status, _ = api_client.call_api(
        path, "PATCH", header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
        auth_settings=["BearerToken"],
        body={"metadata": {"finalizers": None, "labels": {"smp": None}}}, response_type="V1Job",
        _return_http_data_only=False)
    assert status == 200
    assert merged.metadata.finalizers is None
    assert merged.metadata.labels == {"keep": "yes"}

    # Server-side apply through the same client machinery.
    applied, status, _ = api_client.call_api(
        path, "PATCH", query_params=[("fieldManager", "pytest"), ("force", "true")], auth_settings=["BearerToken"],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body={"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "p", "labels": {"applied": "1"}}},
        response_type="V1Job", _return_http_data_only=False)
    assert status == 200
    assert applied.metadata.labels == {"keep": "yes", "applied": "1"}


def test_invalid_jobs_are_422_with_causes(batch, ns):
    with pytest.raises(ApiException) as bad:
        batch.create_namespaced_job(ns, job("bad", restart_policy="Always"))
    assert bad.value.status == 422
    status = json.loads(bad.value.body)
    assert status["reason"] == "Invalid"
    assert status["details"]["kind"] == "Job"
    causes = status["details"]["causes"]
    assert {"reason": "FieldValueRequired", "message": 'Required value: valid values: "OnFailure", "Never"',
            "field": "spec.template.spec.restartPolicy"} in causes

    batch.create_namespaced_job(ns, job("imm", completions=2))
    with pytest.raises(ApiException) as imm:
        batch.patch_namespaced_job("imm", ns, {"spec": {"completions": 3}})
    assert imm.value.status == 422
    assert any(c["field"] == "spec.completions" and c["message"].endswith("field is immutable")
               for c in json.loads(imm.value.body)["details"]["causes"])


def test_status_subresource_enforces_transition_rules(batch, ns):
    batch.create_namespaced_job(ns, job("st"))
    ok = batch.patch_namespaced_job_status(
        "st", ns, {"status": {"startTime": "2025-01-01T00:00:00Z", "active": 1, "failed": 2}})
    assert ok.status.active == 1 and ok.status.failed == 2
    with pytest.raises(ApiException) as dec:
        batch.patch_namespaced_job_status("st", ns, {"status": {"failed": 1}})
    assert dec.value.status == 422
    assert "cannot decrease the failed counter" in dec.value.body
    with pytest.raises(ApiException) as bad:
        batch.patch_namespaced_job_status("st", ns, {"status": {"conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}]}})
    assert bad.value.status == 422
    # A status write never changes the spec, and a main write never changes the status.
    batch.patch_namespaced_job_status("st", ns, {"spec": {"parallelism": 5}, "status": {"active": 0}})
    got = batch.read_namespaced_job("st", ns)
    # `active` is a non-pointer omitempty int32: a real server returns 0 as absent.
    assert got.spec.parallelism == 1 and got.status.active is None
    batch.patch_namespaced_job("st", ns, {"status": {"active": 7}})
    assert batch.read_namespaced_job("st", ns).status.active is None


def test_replace_with_stale_resource_version_conflicts(batch, ns):
    batch.create_namespaced_job(ns, job("rv"))
    stale = batch.read_namespaced_job("rv", ns)
    batch.patch_namespaced_job("rv", ns, {"spec": {"parallelism": 2}})
    stale.spec.parallelism = 4
    with pytest.raises(ApiException) as conflict:
        batch.replace_namespaced_job("rv", ns, stale)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"
    # Deleting with the client's default options (propagation from query params) works.
    batch.delete_namespaced_job("rv", ns, propagation_policy="Background")
    with pytest.raises(ApiException) as gone:
        batch.read_namespaced_job("rv", ns)
    assert gone.value.status == 404


def test_typed_client_lists_are_deserialisable(batch, ns):
    batch.create_namespaced_job(ns, job("t1"))
    jobs = batch.list_job_for_all_namespaces(label_selector="job-name=t1")
    assert isinstance(jobs, client.V1JobList)
    assert [j.metadata.name for j in jobs.items] == ["t1"]
