"""The chart starts as rendered: every pod the chart renders, run here as the kubelet would run it.

For each documented value set (defaults, heap, 3 replicas, auth from an env var, auth mounted as a
file, auth from an existing Secret, S3 against the suite's SeaweedFS) the chart is rendered offline
(helm-python-sdk) and each replica of the StatefulSet runs the container's command and args with its
rendered environment: Secret references resolved from the rendered Secrets (or the test's stand-in
for an existing one), the pod-index label from the replica's ordinal, every volume mount mapped to a
temporary directory, the container port to a free one. A pod passes when its readiness probe's path
answers 200; it fails if the process exits first. Then the client snippet the chart's NOTES print,
and the one in helm/statehouse/README.md, run against those replicas. Last, a pod started on its volume
under another replicaCount with no move between (what the rescale hook Jobs make:
tests/operations/test_chart_rescale.py)
refuses to start unless adoptTopology is set (the offline procedure).
"""

from __future__ import annotations

import ast
import base64
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import helm_python as hp
import httpx
import pytest
import yaml

from tests.support.chart import render as render_with
from tests.support.s3server import ACCESS_KEY, SECRET_KEY
from tests.support.server import ModuleCommand, Process, free_port, run_module, stop_process

pytestmark = [pytest.mark.s3, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "statehouse"
README = CHART / "README.md"
RELEASE, NAMESPACE = "sh", "state"
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"
TOKENS = ["tok-1", "tok-ops:@admin"]
# Stand-ins for Secrets the chart expects to exist (auth.existingSecret, s3.existingSecret).
EXISTING = {"api-tokens": {"tokens": ",".join(TOKENS)}}
S3_SECRET = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}  # the SeaweedFS fixture's

VALUE_SETS = {
    "defaults": {},
    "heap": {"backend": "heap"},
    "3-replicas": {"replicaCount": 3},
    "auth": {"auth": {"enabled": True, "tokens": TOKENS}},
    "auth-file": {"auth": {"enabled": True, "mountAsFile": True, "tokens": TOKENS}},
    "auth-existing-secret": {
        "replicaCount": 2,
        "auth": {"enabled": True, "existingSecret": "api-tokens", "secretKey": "tokens"},
    },
}


def render(values: dict) -> tuple[list[dict], str]:
    chart = hp.Chart.load(CHART)
    try:
        return render_with(chart, values)
    finally:
        chart.close()


def secrets_of(docs: list[dict]) -> dict[str, dict[str, str]]:
    """Every rendered Secret's data, decoded, plus the test's existing Secrets."""
    found = {name: dict(data) for name, data in EXISTING.items()}
    for doc in docs:
        if doc["kind"] == "Secret":
            found[doc["metadata"]["name"]] = {k: base64.b64decode(v).decode() for k, v in doc.get("data", {}).items()}
    return found


class Pod:
    """Replica ``index`` of the rendered StatefulSet, as a local process."""

    def __init__(self, docs: list[dict], index: int, root: Path) -> None:
        """``root`` holds the pod's volumes; a pod made again on the same root finds them as it left them."""
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        spec = sts["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        self.container, self.index = container, index
        secrets = secrets_of(docs)
        root.mkdir(parents=True, exist_ok=True)

        # Volume mounts → temporary directories; Secret volumes get their items as files.
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        self.mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            local = root / mount["name"]
            local.mkdir(exist_ok=True)
            secret = volumes.get(mount["name"], {}).get("secret")
            if secret:
                data = secrets[secret["secretName"]]
                for item in secret.get("items") or [{"key": k, "path": k} for k in data]:
                    (local / item["path"]).write_text(data[item["key"]])
            self.mounts[mount["mountPath"]] = local

        (port,) = container["ports"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [*container.get("command", []), *container.get("args", [])]
        assert command[:3] == ["python", "-m", "statehouse.app.serve"], command
        command[command.index("--host") + 1] = "127.0.0.1"
        assert command[command.index("--port") + 1] == str(port["containerPort"])
        command[command.index("--port") + 1] = str(self.port)
        self.command = command

        env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEHOUSE_", "AWS_"))}
        for var in container.get("env", []):
            env[var["name"]] = self._resolve(var, secrets)
        if "/tmp" in self.mounts:
            env["TMPDIR"] = str(self.mounts["/tmp"])  # the pod's /tmp is an emptyDir
        self.env = env
        self.log_path = root / "pod.log"
        self.process: Process | None = None

    def _resolve(self, var: dict, secrets: dict[str, dict[str, str]]) -> str:
        if "value" in var:
            return self._local_path(var["value"])
        source = var["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == POD_INDEX, source
            return str(self.index)
        ref = source["secretKeyRef"]
        return secrets[ref["name"]][ref["key"]]

    def _local_path(self, value: str) -> str:
        for path, local in self.mounts.items():
            if value == path or value.startswith(path + "/"):
                return str(local) + value[len(path) :]
        return value

    def start(self, timeout: float = 30) -> None:
        """Run until the readiness probe's path answers 200; fail if the process exits first."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        module, argv = self.command[2], self.command[3:]  # python -m MODULE ARGV, as the container runs it
        command = ModuleCommand(module, argv, self.env, self.log_path, cwd=self.log_path.parent, append=True)
        self.process = run_module(command)

    def wait_ready(self, timeout: float = 30) -> None:
        """Until the readiness probe's path answers 200; fails if the process exits first."""
        probe = self.container["readinessProbe"]["httpGet"]
        assert probe["port"] == self.container["ports"][0]["name"]
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            assert code is None, f"pod {self.index} exited with {code}:\n{self.log()}"
            try:
                if httpx.get(self.url + probe["path"], timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"pod {self.index} not ready in {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def notes_snippet(notes: str) -> str:
    """The Python lines NOTES print under "Client hint", dedented."""
    block = notes.split("Client hint", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return "\n".join(line[2:] for line in block)


def readme_snippet() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return block


def readme_install_values() -> dict:
    """The values the README's ``helm install`` command sets (``--set a.b=c``)."""
    values: dict = {}
    install = re.search(r"```sh\n(helm install .*?)```", README.read_text(), re.S)
    assert install, "no helm install block in the chart README"
    for key, raw in re.findall(r"--set ([\w.]+)=(\S+)", install.group(1)):
        value = yaml.safe_load(raw)
        *parents, leaf = key.split(".")
        node = values
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return values


def run_snippet(code: str, pods: list[Pod], rendered_urls: list[str], token: str | None) -> None:
    """``code`` with the chart's replica URLs (which must be the rendered ones, in order) replaced
    by the local pods', run as a new Python process."""
    (listed,) = re.findall(r"^urls = (\[.*?\])$", code, re.M | re.S)
    assert ast.literal_eval(listed) == rendered_urls, listed
    code = code.replace(listed, repr([pod.url for pod in pods]))
    prelude = f"TOKEN = {token!r}\n" if token else ""
    result = subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60, cwd=pods[0].log_path.parent
    )
    assert result.returncode == 0, f"snippet failed:\n{code}\n{result.stdout}{result.stderr}"


def run_chart(values: dict, root: Path, snippets: dict[str, str] | None = None) -> None:
    """Start every replica the chart renders for ``values``; run the NOTES snippet (and ``snippets``)."""
    docs, notes = render(values)
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    replicas = sts["spec"]["replicas"]
    pods = [Pod(docs, i, root / f"pod-{i}") for i in range(replicas)]
    try:
        for pod in pods:  # podManagementPolicy: Parallel
            pod.launch()
        for pod in pods:
            pod.wait_ready()
        token = TOKENS[0] if values.get("auth", {}).get("enabled") else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for pod in pods:
            for probe in ("livenessProbe", "startupProbe"):
                assert httpx.get(pod.url + pod.container[probe]["httpGet"]["path"], timeout=5).status_code == 200
            assert httpx.get(pod.url + "/v1/jobs", headers=headers, timeout=5).status_code == 200
            if token:
                assert httpx.get(pod.url + "/v1/jobs", timeout=5).status_code == 401

        rendered_urls = re.findall(r"^\s+\d+: (http://\S+)$", notes, re.M)
        assert len(rendered_urls) == replicas
        for name, snippet in {"notes": notes_snippet(notes), **(snippets or {})}.items():
            job = f"chart-{name}"
            run_snippet(snippet.replace('"my-job"', f'"{job}"'), pods, rendered_urls, token)
            for pod in pods:  # the job exists on every replica, each holding its own key-group range
                got = httpx.get(f"{pod.url}/v1/jobs/{job}", headers=headers, timeout=5)
                assert got.status_code == 200, got.text
    finally:
        for pod in pods:
            pod.stop()


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_pods_start(name, tmp_path):
    run_chart(VALUE_SETS[name], tmp_path)


def test_rendered_pods_start_with_s3(s3_server, tmp_path):
    """S3 checkpoints: the chart's values point at the suite's SeaweedFS, credentials in the chart's Secret."""

    values = {
        "replicaCount": 2,
        "s3": {
            "enabled": True,
            "bucket": s3_server.bucket,
            "prefix": uuid.uuid4().hex,
            "endpointUrl": s3_server.endpoint,
            "region": "us-east-1",
            "accessKeyId": S3_SECRET["AWS_ACCESS_KEY_ID"],
            "secretAccessKey": S3_SECRET["AWS_SECRET_ACCESS_KEY"],
        },
    }
    run_chart(values, tmp_path)


def test_readme_install_starts_and_its_snippet_runs(s3_server, tmp_path, monkeypatch):
    """The README's ``helm install`` values (3 replicas, S3 and auth from existing Secrets), with
    the bucket and endpoint of the suite's SeaweedFS; the README's client snippet runs against it."""
    values = readme_install_values()
    assert values["replicaCount"] == 3 and values["auth"]["enabled"] and values["s3"]["enabled"]
    values["s3"].update(bucket=s3_server.bucket, endpointUrl=s3_server.endpoint, region="us-east-1")
    values["s3"]["prefix"] = uuid.uuid4().hex
    monkeypatch.setitem(EXISTING, values["s3"]["existingSecret"], S3_SECRET)
    monkeypatch.setitem(EXISTING, values["auth"]["existingSecret"], {"api-tokens": ",".join(TOKENS)})
    run_chart(values, tmp_path, {"readme": readme_snippet()})


def test_every_integer_value_renders_as_an_integer():
    """values.yaml integers reach Helm as floats: 1048576 rendered as "1.048576e+06" stopped the server."""
    big = {
        "checkpoints": {"numRetained": 12345678},
        "limits": {k: 12345678 for k in yaml.safe_load((CHART / "values.yaml").read_text())["limits"]},
        "terminationGracePeriodSeconds": 12345679,
        "gracefulShutdownSeconds": 12345678,
        "startupProbe": {"periodSeconds": 12345678, "timeoutSeconds": 12345678, "failureThreshold": 12345678},
    }
    docs, notes = render(big)
    text = yaml.safe_dump_all(docs) + notes
    assert "e+" not in text
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    for name in (
        "STATEHOUSE_NUM_RETAINED",
        *[n for n in env if n.startswith("STATEHOUSE_MAX_")],
    ):
        assert env[name] == "12345678", (name, env[name])
    assert container["command"][container["command"].index("--timeout-graceful-shutdown") + 1] == "12345678"


def test_a_replica_count_change_starts_only_with_adopt_topology(tmp_path):
    """Pod 0 made again on its volume from a template of replicaCount 2 with no move between (the
    rescale hooks off, or a pod deleted before the grow's move): it refuses to start (its volume records
    1 replica), and starts with ``adoptTopology=true`` (the offline procedure)."""
    docs, _ = render({})
    pod = Pod(docs, 0, tmp_path)
    try:
        pod.start()
        assert httpx.put(f"{pod.url}/v1/jobs/orders", json={"max_parallelism": 128}, timeout=10).status_code == 201
    finally:
        pod.stop()

    rescaled = Pod(render({"replicaCount": 2})[0], 0, tmp_path)
    with pytest.raises(AssertionError, match="pod 0 exited with 2"):
        rescaled.start()
    assert "holds replica 0 of 1 (topology version 1)" in rescaled.log()
    assert "STATEHOUSE_ADOPT_TOPOLOGY=1" in rescaled.log()

    adopted = Pod(render({"replicaCount": 2, "adoptTopology": True})[0], 0, tmp_path)
    try:
        adopted.start()
        shown = httpx.get(f"{adopted.url}/v1/topology", timeout=10).json()
        assert (shown["replica_count"], shown["version"], shown["set_id"]) == (
            2,
            2,
            f"{NAMESPACE}/{RELEASE}-statehouse",
        )
        assert shown["jobs"] == [
            {"job": "orders", "max_parallelism": 128, "key_group_range": [0, 127], "serving": False}
        ]
    finally:
        adopted.stop()


def test_a_live_rescale_upgrade_restarts_no_pod_and_reaches_the_joining_ones():
    """A grow's ``helm upgrade --set replicaCount=M`` changes the pod template; with OnDelete the old pods
    keep running (a RollingUpdate would restart them with the new count around the move), and the
    headless Service publishes the new pods, not ready until the move commits, so the hook's CLI loads them."""
    docs, notes = render({"replicaCount": 3})
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
    (headless,) = [d for d in docs if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert "statehouse rescale --to M" in notes
