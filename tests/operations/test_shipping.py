"""Shipping: the Dockerfile, the Helm chart and the image's entrypoint, without Docker or a cluster.

- the chart renders offline (helm-python-sdk) for default and non-default values, lints strictly, and
  every manifest validates against the Kubernetes 1.32 schemas (kubernetes-validate, strict);
- the values schema rejects bad values;
- hadolint passes on the Dockerfile;
- the service starts with the image's own command line and environment (read from the Dockerfile),
  as PID 1 of its own PID namespace like in a container, answers the HEALTHCHECK, takes a write, exits 0
  on SIGTERM within the grace period and reopens its RocksDB data.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import helm_python as hp
import httpx
import kubernetes_validate
import pytest
import yaml

from tests.support.chart import NAMESPACE, RELEASE, render
from tests.support.docs_blocks import parse
from tests.support.server import free_port

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "statehouse"
DOCKERFILE = REPO / "Dockerfile"
KUBE_VERSION = "1.32.0"
FULLNAME = f"{RELEASE}-statehouse"
HEADLESS = f"{FULLNAME}-headless"

# Settings the chart and docs/operations.md must cover (the contract of DESIGN.md §6 plus the limits).
SETTINGS = [
    "BACKEND",
    "DATA_DIR",
    "REPLICA_INDEX",
    "REPLICA_COUNT",
    "CHECKPOINT_DIR",
    "S3_ENDPOINT_URL",
    "NUM_RETAINED",
    "INCREMENTAL_CHECKPOINTS",
    "SNAPSHOT_COMPRESSION",
    "API_TOKENS",
    "MAX_KEY_BYTES",
    "MAX_VALUE_BYTES",
    "MAX_BATCH_OPS",
    "MAX_BODY_BYTES",
    "MAX_PAGE_SIZE",
    "MAX_STAGED_BYTES",
    "MAX_STAGED_ATTEMPTS",
    "DISK_RESERVE_BYTES",
    "MAX_HEADER_BYTES",
    "HEADER_TIMEOUT_S",
    "BODY_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "KEEP_ALIVE_TIMEOUT_S",
]

FULL = {
    "replicaCount": 3,
    "image": {"repository": "registry.example.com/statehouse", "tag": "0.1.0"},
    "s3": {
        "enabled": True,
        "bucket": "state-bucket",
        "prefix": "/prod/statehouse/",
        "endpointUrl": "http://seaweedfs.storage:8333",
        "region": "eu-west-1",
        "accessKeyId": "AKIAEXAMPLE",
        "secretAccessKey": "secret-example",
    },
    "auth": {"enabled": True, "tokens": ["tok-1", "tok-2"]},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
}
EXISTING = {
    "replicaCount": 3,
    "s3": {"enabled": True, "bucket": "state-bucket", "existingSecret": "aws-creds"},
    "auth": {"enabled": True, "existingSecret": "api-tokens", "secretKey": "tokens"},
}
SCENARIOS = {"default": {}, "full": FULL, "existing-secrets": EXISTING}


# -- rendering helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart():
    loaded = hp.Chart.load(CHART)
    yield loaded
    loaded.close()


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(docs: list[dict]) -> dict:
    (c,) = one(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return c


def env_of(docs: list[dict]) -> dict[str, dict]:
    return {e["name"]: e for e in container(docs)["env"]}


@pytest.fixture(scope="module")
def rendered(chart):
    return {name: render(chart, values) for name, values in SCENARIOS.items()}


# -- lint and schema validation ------------------------------------------------------------------


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_chart_lints_strictly(scenario):
    report = hp.lint(CHART, SCENARIOS[scenario], strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_manifest_validates_against_kubernetes(rendered, scenario):
    docs, _ = rendered[scenario]
    kinds = set()
    for doc in docs:
        kinds.add(doc["kind"])
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: no upstream schema; checked in test_service_monitor
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert {"StatefulSet", "Service", "PodDisruptionBudget", "ServiceAccount"} <= kinds


def test_validation_is_strict(rendered):
    """Guard for the test above: a misspelt field in a rendered manifest does fail validation."""
    sts = json.loads(json.dumps(one(rendered["default"][0], "StatefulSet")))
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSION, strict=True)


BAD_VALUES = [
    ({"replicaCount": 0}, "/replicaCount"),
    ({"replicaCount": "3"}, "/replicaCount"),
    ({"replicaCount": 2.5}, "/replicaCount"),
    ({"backend": "leveldb"}, "/backend"),
    ({"replicas": 3}, "additional properties 'replicas'"),
    ({"s3": {"enabled": True}}, "/s3/bucket"),
    ({"s3": {"enabled": "yes", "bucket": "b-1"}}, "/s3/enabled"),
    ({"auth": {"tokens": "a,b"}}, "/auth/tokens"),
    ({"auth": {"tokens": ["a,b"]}}, "/auth/tokens"),
    ({"persistence": {"size": "lots"}}, "/persistence/size"),
    ({"podDisruptionBudget": {"maxUnavailable": 0}}, "/podDisruptionBudget/maxUnavailable"),
    ({"service": {"port": 70000}}, "/service/port"),
    ({"serviceMonitor": {"interval": 30}}, "/serviceMonitor/interval"),
    ({"checkpoints": {"compression": "gzip"}}, "/checkpoints/compression"),
]


@pytest.mark.parametrize(("values", "where"), BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_schema_rejects_bad_values(chart, values, where):
    with pytest.raises(hp.HelmValuesError) as info:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    assert where in str(info.value)


def test_bad_values_file_fails_lint(tmp_path):
    bad = tmp_path / "bad-values.yaml"
    bad.write_text("replicaCount: -1\nbackend: memory\nimage:\n  repository: statehouse\n  tag: 1\nunknownKey: true\n")
    report = hp.lint(CHART, yaml.safe_load(bad.read_text()), strict=True, kube_version=f"v{KUBE_VERSION}")
    text = json.dumps(report)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])
    for where in ("/replicaCount", "/backend", "/image/tag", "unknownKey"):
        assert where in text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"auth": {"enabled": True}}, "auth.existingSecret or at least one entry in auth.tokens"),
        ({"s3": {"enabled": True, "bucket": "b-1", "accessKeyId": "only-one"}}, "go together"),
        ({"terminationGracePeriodSeconds": 20, "gracefulShutdownSeconds": 20}, "must be greater"),
    ],
)
def test_inconsistent_values_fail_with_a_message(chart, values, message):
    with pytest.raises(hp.HelmError) as info:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(info.value)


# -- what the manifests say ----------------------------------------------------------------------


def test_default_statefulset(rendered):
    docs, _ = rendered["default"]
    sts = one(docs, "StatefulSet", FULLNAME)
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    assert spec["replicas"] == 1
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == HEADLESS
    assert spec["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()

    env = env_of(docs)
    assert env["STATEHOUSE_REPLICA_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert env["STATEHOUSE_REPLICA_COUNT"]["value"] == "1"
    assert env["STATEHOUSE_BACKEND"]["value"] == "rocksdb"
    assert env["STATEHOUSE_DATA_DIR"]["value"] == "/data"
    assert env["STATEHOUSE_CHECKPOINT_DIR"]["value"] == "/checkpoints"
    assert env["STATEHOUSE_NUM_RETAINED"]["value"] == "3"
    assert env["STATEHOUSE_INCREMENTAL_CHECKPOINTS"]["value"] == "true"
    assert env["STATEHOUSE_SNAPSHOT_COMPRESSION"]["value"] == "zstd"
    assert "STATEHOUSE_API_TOKENS" not in env and "AWS_ACCESS_KEY_ID" not in env
    assert "STATEHOUSE_S3_ENDPOINT_URL" not in env

    c = container(docs)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]

    # PVC templates: RocksDB data, and local checkpoints because S3 is off.
    claims = {t["metadata"]["name"]: t for t in spec["volumeClaimTemplates"]}
    assert set(claims) == {"data", "checkpoints"}
    assert claims["data"]["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claims["data"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"data": "/data", "checkpoints": "/checkpoints", "tmp": "/tmp"}
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}} in pod["volumes"]

    # Graceful shutdown: uvicorn's drain timeout fits inside the pod's grace period.
    cmd = c["command"]
    drain = int(cmd[cmd.index("--timeout-graceful-shutdown") + 1])
    assert drain < pod["terminationGracePeriodSeconds"] == 30
    assert cmd[:3] == ["python", "-m", "statehouse.app.serve"]  # one process: one writer per replica
    # integers as integers (a YAML integer is a float to the template: 2.68435456e+08)
    assert env["STATEHOUSE_DISK_RESERVE_BYTES"]["value"] == "268435456"
    assert env["STATEHOUSE_MAX_CONNECTIONS"]["value"] == "1024"


def test_security_context(rendered):
    for scenario in SCENARIOS:
        docs, _ = rendered[scenario]
        pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
        psc, csc = pod["securityContext"], container(docs)["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001 and psc["fsGroup"] == 10001
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert csc["runAsNonRoot"] is True and csc["runAsUser"] == 10001
        assert csc["readOnlyRootFilesystem"] is True
        assert csc["allowPrivilegeEscalation"] is False
        assert csc["capabilities"] == {"drop": ["ALL"]}
        assert csc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False


def test_services_and_pdb(rendered):
    docs, _ = rendered["default"]
    pod_labels = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    headless = one(docs, "Service", HEADLESS)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    regular = one(docs, "Service", FULLNAME)
    assert regular["spec"]["type"] == "ClusterIP" and "clusterIP" not in regular["spec"]
    for svc in (headless, regular):
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    pdb = one(docs, "PodDisruptionBudget", FULLNAME)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert not [d for d in docs if d["kind"] in ("ServiceMonitor", "Secret")]


def test_s3_and_auth_with_chart_created_secrets(rendered):
    docs, _ = rendered["full"]
    env = env_of(docs)
    assert env["STATEHOUSE_REPLICA_COUNT"]["value"] == "3"
    assert env["STATEHOUSE_CHECKPOINT_DIR"]["value"] == "s3://state-bucket/prod/statehouse"
    assert env["STATEHOUSE_S3_ENDPOINT_URL"]["value"] == "http://seaweedfs.storage:8333"
    assert env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
    assert container(docs)["image"] == "registry.example.com/statehouse:0.1.0"

    s3_secret = one(docs, "Secret", f"{FULLNAME}-s3")
    decoded = {k: base64.b64decode(v).decode() for k, v in s3_secret["data"].items()}
    assert decoded == {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-example"}
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-s3", "key": var}

    auth_secret = one(docs, "Secret", f"{FULLNAME}-auth")
    assert base64.b64decode(auth_secret["data"]["api-tokens"]).decode() == "tok-1,tok-2"
    assert env["STATEHOUSE_API_TOKENS"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-auth",
        "key": "api-tokens",
    }

    # Chart-created secrets roll the pods when they change.
    assert one(docs, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
    # With S3 the checkpoints do not need a local volume.
    sts = one(docs, "StatefulSet")
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert "checkpoints" not in {m["name"] for m in container(docs)["volumeMounts"]}


def test_s3_and_auth_with_existing_secrets(rendered):
    docs, _ = rendered["existing-secrets"]
    env = env_of(docs)
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert env["STATEHOUSE_CHECKPOINT_DIR"]["value"] == "s3://state-bucket/statehouse"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "aws-creds", "key": "AWS_ACCESS_KEY_ID"}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "aws-creds"
    assert env["STATEHOUSE_API_TOKENS"]["valueFrom"]["secretKeyRef"] == {"name": "api-tokens", "key": "tokens"}
    assert "STATEHOUSE_S3_ENDPOINT_URL" not in env


def test_s3_with_pod_iam_role(chart):
    docs, _ = render(chart, {"s3": {"enabled": True, "bucket": "state-bucket"}})
    env = env_of(docs)
    assert env["STATEHOUSE_CHECKPOINT_DIR"]["value"] == "s3://state-bucket/statehouse"
    assert "AWS_ACCESS_KEY_ID" not in env
    assert not [d for d in docs if d["kind"] == "Secret"]


def test_service_monitor(rendered):
    docs, _ = rendered["full"]
    sm = one(docs, "ServiceMonitor", FULLNAME)
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}]
    # Selects the headless Service only, so every replica is scraped once.
    selected = [
        s["metadata"]["name"]
        for s in docs
        if s["kind"] == "Service" and sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert selected == [HEADLESS]
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_notes_list_every_replica_url(rendered):
    _, notes = rendered["full"]
    urls = re.findall(r"^\s+(\d+): (http://\S+)$", notes, re.M)
    assert urls == [(str(i), f"http://{FULLNAME}-{i}.{HEADLESS}.{NAMESPACE}.svc.cluster.local:8000") for i in range(3)]
    assert "StatehouseClient(urls, token=TOKEN)" in notes and notes.count(f".{HEADLESS}.{NAMESPACE}.svc") >= 6
    assert f"Secret {FULLNAME}-auth" in notes
    _, default_notes = rendered["default"]
    assert len(re.findall(r"^\s+\d+: http://", default_notes, re.M)) == 1
    assert "cannot" in default_notes  # the warning about local checkpoints and rescaling


def test_every_setting_is_wired_and_documented(rendered):
    env = env_of(rendered["full"][0])
    operations = (REPO / "docs" / "operations.md").read_text()
    from statehouse.app.settings import Settings

    for name in SETTINGS:
        assert name.lower() in Settings.model_fields, name
        assert f"STATEHOUSE_{name}" in env, f"chart does not set STATEHOUSE_{name}"
        assert f"`STATEHOUSE_{name}`" in operations, f"docs/operations.md does not document STATEHOUSE_{name}"


def test_the_readme_renders_the_chart_without_helm(chart):
    """helm/statehouse/README.md's "Rendering without helm" command, run as written from the
    repository root: it prints the manifests of the install the README shows, a StatefulSet of 3."""
    readme = CHART / "README.md"
    [block] = [b for b in parse(readme) if "tests.support.helm_template" in b.code]
    assert block.language == "bash" and block.marker is None, block
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    printed = [d for d in yaml.safe_load_all(result.stdout) if d]
    statefulset = one(printed, "StatefulSet", FULLNAME)
    assert (statefulset["metadata"]["namespace"], statefulset["spec"]["replicas"]) == (NAMESPACE, 3)
    assert container(printed)["image"].startswith("registry.example.com/statehouse:")
    values = {
        "image": {"repository": "registry.example.com/statehouse"},
        "replicaCount": 3,
        "s3": {"enabled": True, "bucket": "spark-state", "existingSecret": "statehouse-s3"},
        "auth": {"enabled": True, "existingSecret": "statehouse-tokens"},
    }
    manifests, _notes = render(chart, values)

    def by_name(docs: list[dict]) -> list[dict]:
        return sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"]))

    assert by_name(printed) == by_name(manifests)  # what the library renders for those values, every manifest


# -- Dockerfile ----------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def runtime_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def image_env() -> dict[str, str]:
    env = {}
    for op, args in runtime_stage():
        if op == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def image_json(op_name: str) -> list[str]:
    (args,) = [args for op, args in runtime_stage() if op == op_name]
    return json.loads(args)


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_dockerfile_facts():
    instructions = dockerfile_instructions()
    froms = [args for op, args in instructions if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS builder") and froms[1].endswith("AS runtime")
    assert "python:3.11-slim" in DOCKERFILE.read_text()
    runtime = dict((op, args) for op, args in runtime_stage() if op in ("USER", "EXPOSE", "VOLUME"))
    assert runtime["USER"] == "10001:10001"
    assert runtime["EXPOSE"] == "8000"
    assert "/data" in json.loads(runtime["VOLUME"])
    assert not any("[dev]" in args for _, args in instructions)
    assert any(op == "COPY" and args.startswith("--from=builder") for op, args in runtime_stage())
    env = image_env()
    assert env["STATEHOUSE_DATA_DIR"] == "/data" and env["STATEHOUSE_BACKEND"] == "rocksdb"
    healthcheck = next(args for op, args in runtime_stage() if op == "HEALTHCHECK")
    assert "urllib.request" in healthcheck and "/healthz" in healthcheck and "curl" not in healthcheck


def test_chart_runs_the_image_command(rendered):
    """The chart repeats the image's CMD (with its own drain timeout): keep the two in step."""
    cmd = image_json("CMD")
    assert cmd[:3] == ["python", "-m", "statehouse.app.serve"] and "--timeout-graceful-shutdown" in cmd
    assert container(rendered["default"][0])["command"] == cmd
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert cmd[cmd.index("--timeout-graceful-shutdown") + 1] == str(values["gracefulShutdownSeconds"])


def test_dockerignore_keeps_the_context_small():
    """The context is an allowlist: everything is excluded, then what the image's two `pip
    install`s need comes back (both pyproject.toml files, the readmes, every package folder they
    map into the statehouse namespace) and nothing else (tests, bench, docs, helm, local state)."""
    import tomllib

    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in lines if line[:1] not in ("", "#")]
    assert patterns[0] == "*"
    included = {line[1:] for line in patterns if line.startswith("!")}
    needed = {"pyproject.toml", "README.md"}
    for pyproject in (REPO / "pyproject.toml", REPO / "client/packaging/pyproject.toml"):
        for folder in tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"].values():
            needed.add((pyproject.parent / folder).resolve().relative_to(REPO).parts[0])
    assert included == needed


# -- the image's entrypoint, for real ------------------------------------------------------------


def pid_namespace_prefix() -> list[str] | None:
    """A prefix that runs a command as PID 1 of a new PID namespace, as in a container; None if unavailable."""
    if not shutil.which("unshare"):
        return None
    for prefix in (
        ["unshare", "--pid", "--fork", "--kill-child"],
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child"],
    ):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


class Entrypoint:
    """The image's CMD and ENV, with the data and checkpoint directories in ``root`` and a free port."""

    def __init__(self, root: Path, prefix: list[str] | None):
        self.root, self.prefix = root, prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = image_json("CMD")
        assert cmd[0] == "python"
        cmd = [sys.executable, *cmd[1:]]
        cmd[cmd.index("--host") + 1] = "127.0.0.1"
        cmd[cmd.index("--port") + 1] = str(self.port)
        self.cmd = cmd
        self.grace = int(cmd[cmd.index("--timeout-graceful-shutdown") + 1])
        image = image_env()
        image.pop("PATH", None)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("STATEHOUSE_")}
        self.env.update(image)
        self.env["STATEHOUSE_DATA_DIR"] = str(root / image["STATEHOUSE_DATA_DIR"].lstrip("/"))
        self.env["STATEHOUSE_CHECKPOINT_DIR"] = str(root / image["STATEHOUSE_CHECKPOINT_DIR"].lstrip("/"))
        self.process: subprocess.Popen | None = None
        self.log_path = root / "server.log"

    def start(self, timeout: float = 20) -> None:
        workdir = self.root / "cwd"  # not the repo: the app comes from the installed package, as in the image
        workdir.mkdir(exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*(self.prefix or []), *self.cmd], cwd=workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"server exited:\n{self.log()}"
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"server not ready in {timeout}s:\n{self.log()}")

    def server_pid(self) -> int:
        """The uvicorn process: the child of unshare (PID 1 in its namespace), or the process itself."""
        assert self.process is not None
        if not self.prefix:
            return self.process.pid
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def terminate(self) -> tuple[int, float]:
        """SIGTERM to the server, as the kubelet sends it to the container's PID 1; (exit code, seconds)."""
        assert self.process is not None
        started = time.monotonic()
        os.kill(self.server_pid(), signal.SIGTERM)
        try:
            code = self.process.wait(self.grace + 10)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.mark.slow
def test_entrypoint_serves_drains_and_reopens(tmp_path):
    prefix = pid_namespace_prefix()
    server = Entrypoint(tmp_path, prefix)
    assert server.env["STATEHOUSE_BACKEND"] == "rocksdb"
    try:
        server.start()
        health = httpx.get(server.url + "/healthz", timeout=5)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        assert "server" not in health.headers  # --no-server-header

        # The image's HEALTHCHECK command, pointed at this port.
        (healthcheck,) = [args for op, args in runtime_stage() if op == "HEALTHCHECK"]
        check = json.loads(healthcheck.split(" CMD ", 1)[1])
        assert check[0] == "python"
        probe = [sys.executable, *[a.replace(":8000/", f":{server.port}/") for a in check[1:]]]
        assert subprocess.run(probe, timeout=10).returncode == 0

        with httpx.Client(base_url=server.url + "/v1", timeout=10) as http:
            assert http.put("/jobs/shipping", json={"max_parallelism": 128}).status_code == 201
            assert http.put("/jobs/shipping/states/last", json={"kind": "value"}).status_code == 201
            assert http.put("/jobs/shipping/states/last/keys/alice", json={"value": {"n": 42}}).status_code < 300

        code, seconds = server.terminate()
        log = server.log()
        assert "Application shutdown complete" in log
        assert seconds < server.grace
        if prefix:
            assert code == 0, log  # PID 1: the SIGTERM uvicorn re-raises after its drain is ignored
        else:
            assert code in (0, -signal.SIGTERM), log  # not PID 1 here: uvicorn re-raises SIGTERM after draining

        # Same volume, new process: the value is there (RocksDB closed cleanly, nothing to repair).
        server.start()
        with httpx.Client(base_url=server.url + "/v1", timeout=10) as http:
            got = http.get("/jobs/shipping/states/last/keys/alice")
            assert got.status_code == 200 and got.json() == {"value": {"n": 42}}
        assert server.terminate()[0] in ((0,) if prefix else (0, -signal.SIGTERM))
        assert (tmp_path / "data" / "shipping" / "CURRENT").exists()
    finally:
        server.kill()


def test_values_schema_and_readme_cover_every_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]) == set(values)
    readme = (CHART / "README.md").read_text()
    for key, value in values.items():
        if isinstance(value, dict) and value and key not in ("resources", "podSecurityContext", "securityContext"):
            for sub in value:
                assert f"`{key}.{sub}" in readme or f"`{key}.*`" in readme, f"{key}.{sub} not in the chart README"
        else:
            assert f"`{key}`" in readme or f"`{key}." in readme, f"{key} not in the chart README"


@pytest.mark.slow
def test_auth_tokens_mounted_as_a_file(chart, tmp_path, monkeypatch):
    """``auth.mountAsFile``: the Secret's key becomes /etc/statehouse/auth/tokens and
    STATEHOUSE_API_TOKENS_FILE names it; the tokens are not in the environment. The chart's Secret
    holds what the server reads from the file as is (scoped entries included)."""
    tokens = ["tok-1:orders+clicks", "tok-2", "tok-3:@admin"]
    for auth in ({"tokens": tokens}, {"existingSecret": "api-tokens", "secretKey": "tokens"}):
        docs, _ = render(chart, {"auth": {"enabled": True, "mountAsFile": True, **auth}})
        for doc in docs:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        env = env_of(docs)
        assert "STATEHOUSE_API_TOKENS" not in env
        assert env["STATEHOUSE_API_TOKENS_FILE"]["value"] == "/etc/statehouse/auth/tokens"
        mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "auth-tokens")
        assert mount == {"name": "auth-tokens", "mountPath": "/etc/statehouse/auth", "readOnly": True}
        volumes = one(docs, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
        secret = next(v for v in volumes if v["name"] == "auth-tokens")["secret"]
        name, key = (f"{FULLNAME}-auth", "api-tokens") if "tokens" in auth else ("api-tokens", "tokens")
        assert secret["secretName"] == name and secret["items"] == [{"key": key, "path": "tokens"}]

    docs, _ = render(chart, {"auth": {"enabled": True, "mountAsFile": True, "tokens": tokens}})
    mounted = tmp_path / "tokens"
    mounted.write_bytes(base64.b64decode(one(docs, "Secret", f"{FULLNAME}-auth")["data"]["api-tokens"]))
    for name in [k for k in os.environ if k.upper().startswith("STATEHOUSE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("STATEHOUSE_API_TOKENS_FILE", str(mounted))
    from statehouse.app.settings import Settings

    grants = Settings().grants
    assert grants["tok-1"].jobs == {"orders", "clicks"} and grants["tok-2"].all_jobs and grants["tok-3"].admin
