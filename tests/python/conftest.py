"""Fixtures: one API server per backend and test session, a fresh namespace per test.

Every test runs on each backend named by $KJOB_PY_BACKENDS (comma-separated): `sim` and `real`.
The default is `sim,real` when $KJOB_TEST_CLUSTER names a running real control plane (the run
folder of `kjob-cluster up`, as `make test` starts it), else `sim`. The same requests go to both
servers, so a difference between kjob-sim and kube-apiserver fails a test on one of them.

The simulator binary comes from $KJOB_SIM_BIN, else <repo>/target/debug/kjob-sim
(build it with `cargo build -p kjob-sim`). It listens on a free loopback port, writes a
kubeconfig, and runs its simulated kubelet so pods move through their real lifecycle. On the
real control plane kjob-node-agent plays kubelet with the same stages.
"""

import json
import os
import pathlib
import queue
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid

import pytest
from kubernetes import client, config

REPO = pathlib.Path(__file__).resolve().parents[2]
# How long the simulator may take to print its URL on a loaded machine.
STARTUP_TIMEOUT_S = 30


def sim_binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("KJOB_SIM_BIN", REPO / "target" / "debug" / "kjob-sim"))
    if not path.exists():
        pytest.fail(f"kjob-sim binary not found at {path}: run `cargo build -p kjob-sim` or set KJOB_SIM_BIN")
    return path


class Sim:
    """A running kjob-sim process."""

    def __init__(self, url: str, kubeconfig: str, proc: subprocess.Popen, log_path: str):
        self.url = url
        self.kubeconfig = kubeconfig
        self.proc = proc
        self.log_path = log_path

    def hook(self, path: str, body: dict | None = None) -> dict:
        """POSTs to a /sim/... test hook and returns its JSON answer."""
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(
            f"{self.url}/sim/{path}", data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")


class Real:
    """The real control plane named by $KJOB_TEST_CLUSTER (cluster-admin kubeconfig)."""

    def __init__(self, cluster_dir: str):
        self.dir = cluster_dir
        self.kubeconfig = os.path.join(cluster_dir, "kubeconfig")
        if not os.path.exists(self.kubeconfig):
            pytest.fail(f"{self.kubeconfig} not found: is the real control plane up (make cluster-up)?")

    def hook(self, path: str, body: dict | None = None) -> dict:
        pytest.skip(f"/sim/{path} is a kjob-sim test hook; a real kube-apiserver has no equivalent")


def backends() -> list[str]:
    default = "sim,real" if os.environ.get("KJOB_TEST_CLUSTER") else "sim"
    return [b.strip() for b in os.environ.get("KJOB_PY_BACKENDS", default).split(",") if b.strip()]


@pytest.fixture(scope="session", params=backends())
def server(request):
    if request.param == "real":
        cluster_dir = os.environ.get("KJOB_TEST_CLUSTER")
        if not cluster_dir:
            pytest.fail("backend 'real' needs $KJOB_TEST_CLUSTER (the run folder of make cluster-up)")
        yield Real(cluster_dir)
        return
    if request.param != "sim":
        pytest.fail(f"unknown backend {request.param!r} in KJOB_PY_BACKENDS")
    yield from run_sim()


@pytest.fixture(scope="session")
def sim(server):
    """The backend's server; its sim-only hooks skip on the real one, saying why."""
    return server


def run_sim():
    tmp = tempfile.mkdtemp(prefix="kjob-sim-py-")
    kubeconfig = os.path.join(tmp, "kubeconfig")
    log_path = os.path.join(tmp, "sim.log")
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [str(sim_binary()), "--listen", "127.0.0.1:0", "--kubeconfig-out", kubeconfig, "--kubelet", "auto"],
        stdout=subprocess.PIPE,
        stderr=log,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        first = lines.get(timeout=STARTUP_TIMEOUT_S).decode().strip()
    except queue.Empty:
        proc.kill()
        pytest.fail(f"kjob-sim printed no URL within {STARTUP_TIMEOUT_S}s; log: {log_path}")
    if not first.startswith("http://"):
        proc.kill()
        pytest.fail(f"kjob-sim first stdout line is not a URL: {first!r}; log: {log_path}")
    # Keep draining stdout so the process never blocks on a full pipe.
    threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()
    yield Sim(first, kubeconfig, proc, log_path)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def api_client(server):
    return config.new_client_from_config(config_file=server.kubeconfig)


@pytest.fixture
def core(api_client):
    return client.CoreV1Api(api_client)


@pytest.fixture
def batch(api_client):
    return client.BatchV1Api(api_client)


@pytest.fixture
def ns(server, core):
    name = f"py-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # A real server refuses pods until the serviceaccount controller made `default`.
    deadline = time.monotonic() + 30
    while isinstance(server, Real) and not core.list_namespaced_service_account(name, field_selector="metadata.name=default").items:
        if time.monotonic() > deadline:
            pytest.fail(f"namespace {name} got no default ServiceAccount within 30 s")
        time.sleep(0.1)
    yield name
    core.delete_namespace(name)
