"""Builders for the objects the tests create, and a polling helper."""

import time

import pytest
from kubernetes import client

# Upper bound for any condition a test waits for.
WAIT_TIMEOUT_S = 20


def job(name: str, labels: dict | None = None, restart_policy: str = "Never", annotations: dict | None = None,
        **spec) -> client.V1Job:
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(annotations=annotations),
        spec=client.V1PodSpec(
            restart_policy=restart_policy,
            containers=[client.V1Container(name="main", image="busybox:1.36", command=["true"])],
        ),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1JobSpec(template=template, **spec),
    )


def pod(name: str, annotations: dict | None = None, restart_policy: str = "Never",
        containers: tuple = ("main",)) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            restart_policy=restart_policy,
            containers=[client.V1Container(name=c, image="busybox") for c in containers],
        ),
    )


def wait_for(what: str, fn, timeout: float = WAIT_TIMEOUT_S, interval: float = 0.1):
    """Polls fn() until it returns something truthy; fails with the last value after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
