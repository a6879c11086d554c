"""kjob-queue's explain API read by a client nobody on the project wrote (the standard library's
urllib), for a Job in request backoff.

kjob-queue runs as the built binary (development mode: plaintext gRPC, admin port on loopback)
over its own redis-server. The Job is put into backoff through kjob-queue's own gRPC API with
grpcio's generic calls on hand-encoded protobuf (no stubs): Add, Lease, then Done with the
rate-limited outcome and an error, twice, so the second failure waits 2 s (1 s doubling).
"""

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import pytest

from test_queue_auth import free_port, queue_binary, wait_listening

CALL_TIMEOUT_S = 10
KEY = "py-explain/backoff"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number: int, value) -> bytes:
    """One protobuf field: a varint for ints, length-delimited for str/bytes."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint((number << 3) | 2) + varint(len(data)) + data


def fields(msg: bytes) -> list[tuple[int, object]]:
    """The (number, value) pairs of a protobuf message (varints and length-delimited only)."""
    out, i = [], 0
    while i < len(msg):
        tag, shift = 0, 0
        while True:
            b = msg[i]
            i += 1
            tag |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        number, wire = tag >> 3, tag & 7
        n, shift = 0, 0
        while True:
            b = msg[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        if wire == 0:
            out.append((number, n))
        elif wire == 2:
            out.append((number, msg[i : i + n]))
            i += n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


@pytest.fixture(scope="module")
def queue():
    """(gRPC address, admin base URL) of a kjob-queue in development mode."""
    redis = shutil.which("redis-server")
    if redis is None:
        pytest.fail("redis-server not found: run scripts/setup.sh")
    procs = []
    with tempfile.TemporaryDirectory(prefix="kjob-explain-") as tmp:
        redis_port, grpc_port, admin_port = free_port(), free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            )
        )
        wait_listening(redis_port, procs[-1], "redis-server")
        log = open(f"{tmp}/kjob-queue.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    queue_binary(),
                    f"--listen=127.0.0.1:{grpc_port}",
                    f"--redis-url=redis://127.0.0.1:{redis_port}",
                    f"--admin-listen=127.0.0.1:{admin_port}",
                    "--insecure-no-auth",
                ],
                stdout=log,
                stderr=log,
            )
        )
        try:
            wait_listening(grpc_port, procs[-1], "kjob-queue")
            wait_listening(admin_port, procs[-1], "kjob-queue's admin port")
            yield f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{admin_port}"
        finally:
            for p in reversed(procs):
                p.kill()
                p.wait()
            log.close()


def rpc(ch: grpc.Channel, method: str, request: bytes) -> bytes:
    call = ch.unary_unary(f"/kjob.queue.v1.Queue/{method}", request_serializer=None, response_deserializer=None)
    return call(request, timeout=CALL_TIMEOUT_S)


def fail_once(ch: grpc.Channel, error: str) -> None:
    """Leases KEY (the only key ready) and finishes it as a failed sync."""
    lease = rpc(
        ch,
        "Lease",
        field(1, "job") + field(2, 1) + field(3, 60_000) + field(4, 5_000) + field(5, "py-worker"),
    )
    items = [dict(fields(v)) for n, v in fields(lease) if n == 1]
    assert len(items) == 1 and items[0][1] == KEY.encode(), items
    lease_id = items[0][2].decode()
    done = field(1, "job") + field(2, KEY) + field(3, lease_id) + field(4, 2) + field(9, error)
    rpc(ch, "Done", done)


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=CALL_TIMEOUT_S) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_job_in_request_backoff_shows_its_failures_and_next_retry(queue):
    address, admin = queue
    with grpc.insecure_channel(address) as ch:
        rpc(ch, "Add", field(1, field(1, "job") + field(2, KEY)))
        fail_once(ch, "first failure")
        time.sleep(1.2)  # its 1 s backoff passes; the next Lease promotes it
        fail_once(ch, 'pods "p" is forbidden: exceeded quota')

    status, x = get(f"{admin}/api/v1/jobs/{KEY}")
    assert status == 200, x
    assert x["state"] == "delayed"
    assert x["reason_code"] == "request_backoff"
    assert "2 failures" in x["reason"]
    # The second failure waits 2 s: the due time is within 1 s of that.
    assert abs(x["due_in_seconds"] - 2.0) < 1.0, x
    assert x["backoff"]["failures"] == 2
    assert x["backoff"]["next_delay_seconds"] == 4.0
    assert x["last_sync"]["outcome"] == "error"
    assert x["last_sync"]["worker"] == "py-worker"
    assert x["last_sync"]["error"] == 'pods "p" is forbidden: exceeded quota'
    # Only what was off the happy path: the two failures (the enqueue is not history).
    assert [h["event"] for h in x["history"]] == ["synced", "synced"]

    status, e = get(f"{admin}/api/v1/jobs/py-explain/never-seen")
    assert status == 404 and e["error"]["code"] == "not_found", e
    status, e = get(f"{admin}/api/v1/jobs/Bad_Namespace/x")
    assert status == 400 and e["error"]["code"] == "invalid_argument", e

    status, n = get(f"{admin}/api/v1/namespaces")
    assert status == 200, n
    row = next(r for r in n["namespaces"] if r["namespace"] == "py-explain")
    assert (row["ready"], row["delayed"], row["leased"]) == (0, 1, 0), row
    # kjob-queue counts its Dones in memory and publishes them every 5 s (meanwhile the Job's
    # backoff may pass and the sweep make it ready).
    deadline = time.monotonic() + 10
    while True:
        status, n = get(f"{admin}/api/v1/namespaces")
        assert status == 200, n
        row = next(r for r in n["namespaces"] if r["namespace"] == "py-explain")
        assert row["ready"] + row["delayed"] == 1 and row["leased"] == 0, row
        if row["syncs_per_second"] > 0:
            break
        assert time.monotonic() < deadline, n
        time.sleep(0.2)
    assert n["replicas_counted"] == 1, n
