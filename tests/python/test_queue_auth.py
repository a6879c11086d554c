"""kjob-queue refuses a raw gRPC client it cannot authenticate or whose role may not call an RPC.

grpcio's generic `unary_unary` on raw bytes, as a client with no stubs would call: no client
certificate gets UNAUTHENTICATED; the worker's certificate calling the watcher-only CacheSession
gets PERMISSION_DENIED (and Lease, which workers may call, is not refused); a request past the
size limit gets INVALID_ARGUMENT naming it. kjob-queue runs as the built binary with certificates
from `kjob-queue certs`, over its own redis-server.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import grpc
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# How long redis-server and kjob-queue may take to listen on a loaded machine.
STARTUP_TIMEOUT_S = 30
# Deadline of one call: a refusal answers at once.
CALL_TIMEOUT_S = 10


def queue_binary() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("KJOB_QUEUE_BIN", REPO / "target" / "debug" / "kjob-queue"))
    if not path.exists():
        pytest.fail(f"kjob-queue binary not found at {path}: run `cargo build --bins` or set KJOB_QUEUE_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"{what} does not listen on {port} after {STARTUP_TIMEOUT_S}s")


@pytest.fixture(scope="module")
def secure_queue():
    """(address, certificate folder) of a kjob-queue serving mTLS."""
    redis = shutil.which("redis-server")
    if redis is None:
        pytest.fail("redis-server not found: run scripts/setup.sh")
    procs = []
    with tempfile.TemporaryDirectory(prefix="kjob-queue-auth-") as tmp:
        certs = pathlib.Path(tmp) / "certs"
        subprocess.run(
            [queue_binary(), "certs", f"--out={certs}", "--host=127.0.0.1", "--host=localhost"],
            check=True,
            capture_output=True,
        )
        redis_port, grpc_port = free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            )
        )
        wait_listening(redis_port, procs[-1], "redis-server")
        server = certs / "kjob-queue-tls"
        log = open(pathlib.Path(tmp) / "kjob-queue.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    queue_binary(),
                    f"--listen=127.0.0.1:{grpc_port}",
                    f"--redis-url=redis://127.0.0.1:{redis_port}",
                    "--admin-listen=127.0.0.1:0",
                    f"--tls-cert-file={server / 'tls.crt'}",
                    f"--tls-key-file={server / 'tls.key'}",
                    f"--client-ca-file={certs / 'ca.crt'}",
                ],
                stdout=log,
                stderr=log,
            )
        )
        try:
            wait_listening(grpc_port, procs[-1], "kjob-queue")
            yield f"127.0.0.1:{grpc_port}", certs
        finally:
            for p in reversed(procs):
                p.kill()
                p.wait()
            log.close()


def channel(address: str, certs: pathlib.Path, secret: str | None) -> grpc.Channel:
    """A TLS channel trusting the kjob CA, presenting the certificate of `secret` if given."""
    ca = (certs / "ca.crt").read_bytes()
    if secret is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        d = certs / secret
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=(d / "tls.key").read_bytes(),
            certificate_chain=(d / "tls.crt").read_bytes(),
        )
    return grpc.secure_channel(address, creds)


def call(ch: grpc.Channel, path: str) -> grpc.StatusCode:
    """Calls `path` with an empty message on raw bytes; the status code it ends with."""
    rpc = ch.unary_unary(path, request_serializer=None, response_deserializer=None)
    try:
        rpc(b"", timeout=CALL_TIMEOUT_S)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def test_no_client_certificate_is_unauthenticated(secure_queue):
    address, certs = secure_queue
    with channel(address, certs, None) as ch:
        assert call(ch, "/kjob.queue.v1.Queue/Lease") == grpc.StatusCode.UNAUTHENTICATED
        assert call(ch, "/grpc.health.v1.Health/Check") == grpc.StatusCode.UNAUTHENTICATED


def test_worker_certificate_may_not_call_the_watchers_rpc(secure_queue):
    address, certs = secure_queue
    with channel(address, certs, "kjob-worker-tls") as ch:
        assert call(ch, "/kjob.queue.v1.JobState/CacheSession") == grpc.StatusCode.PERMISSION_DENIED
        # Its own RPC gets past authorization: the empty request fails validation instead.
        assert call(ch, "/kjob.queue.v1.Queue/Lease") == grpc.StatusCode.INVALID_ARGUMENT


def test_a_request_past_the_size_limit_is_refused_naming_it(secure_queue):
    """One byte past kjob-queue's 8 MiB request limit, from the watcher (who may call Add):
    refused before it is decoded, with INVALID_ARGUMENT naming the limit."""
    address, certs = secure_queue
    limit = 8 * 1024 * 1024
    with channel(address, certs, "kjob-watcher-tls") as ch:
        rpc = ch.unary_unary("/kjob.queue.v1.Queue/Add", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            rpc(b"\0" * (limit + 1), timeout=CALL_TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert "MAX_REQUEST_BYTES" in refused.value.details()
        assert str(limit) in refused.value.details()
