"""`helm upgrade --set replicaCount=M` rescales live: the chart's rescale hook Jobs, rendered and run.

The chart is rendered offline (helm-python-sdk) as Helm renders an upgrade (``.Release.IsUpgrade``)
for 2 -> 3 and 3 -> 2 replicas; every hook manifest validates against the Kubernetes schemas
(kubernetes-validate, strict), and carries the hook events, weight, delete and log policies the
design needs (a shrink's move runs before the StatefulSet shrinks, a grow's after its new pods
start; a failed Job stays for its log). Then the rendered hook Jobs' containers run here, as the
kubelet would run them (their command, args and environment; the headless Service's names mapped
to local replicas), against a local RocksDB replica set over one shared checkpoint directory (the
stand-in for S3) whose replicas run with the environment the rendered StatefulSet gives its pods,
while writers append through every door: the grow and the shrink commit, a re-run is a no-op that
exits 0, an old pod restarted with the upgraded template serves, and afterwards every acknowledged
write is present exactly once and every key lives only on its owner.
"""

from __future__ import annotations

import base64
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as hp
import httpx
import kubernetes_validate
import pytest
import yaml

from statehouse.client import StatehouseClient
from tests.support.replica_set import ReplicaSet, misplaced
from tests.support.server import ServerProcess, await_ready, launch_server
from tests.support.writers import Writers

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "statehouse"
KUBE_VERSION = "1.32.0"
RELEASE, NAMESPACE = "sh", "state"
FULLNAME = f"{RELEASE}-statehouse"
# A replica's URL through the headless Service, as the chart renders it (the index captured).
POD_URL = re.compile(
    rf"http://{FULLNAME}-(\d+|\{{index\}})\.{FULLNAME}-headless\.{NAMESPACE}\.svc\.cluster\.local:8000"
)
S3 = {"enabled": True, "bucket": "state-bucket", "prefix": "statehouse"}
TOKENS = ["app-token:orders", "ops-token:@admin"]
# What the rendered StatefulSet tells a pod about its place in the set (and which the test keeps).
TOPOLOGY_SETTINGS = ("STATEHOUSE_REPLICA_COUNT", "STATEHOUSE_REPLICA_SET_ID", "STATEHOUSE_TOPOLOGY_VERSION")

JOB = "orders"
STATE = "appended"
MAX_PARALLELISM = 32
KEYS = [f"user-{i}" for i in range(60)]


# -- rendering -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart() -> Iterator[hp.Chart]:
    loaded = hp.Chart.load(CHART)
    yield loaded
    loaded.close()


def render_upgrade(chart: hp.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every manifest of ``helm upgrade`` with ``values`` (revision 2), hooks included."""
    out = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, revision=2, is_upgrade=True)
    return [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def hooks(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rescale hook Jobs by phase ("pre", "post")."""
    jobs = [d for d in docs if d["kind"] == "Job"]
    found = {d["metadata"]["name"].rsplit("-", 1)[1]: d for d in jobs}
    assert len(found) == len(jobs)
    return found


def hook_container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# The upgrade's render depends on the new count only: the Jobs learn the old one from the replicas.
@pytest.mark.parametrize("after", [3, 2], ids=["grow-2-to-3", "shrink-3-to-2"])
@pytest.mark.parametrize("auth", [False, True], ids=["no-auth", "auth"])
def test_hook_jobs_render_validate_and_are_hooks(chart: hp.Chart, after: int, auth: bool) -> None:
    values: dict[str, Any] = {"replicaCount": after, "s3": S3}
    if auth:
        values["auth"] = {"enabled": True, "tokens": TOKENS}
    docs = render_upgrade(chart, values)
    found = hooks(docs)
    assert set(found) == {"pre", "post"}
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    selector = sts["spec"]["selector"]["matchLabels"]
    for phase, job in found.items():
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
        meta = job["metadata"]
        assert meta["namespace"] == NAMESPACE and meta["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert len(meta["name"]) <= 63
        notes = meta["annotations"]
        # A shrink moves before Helm shrinks the StatefulSet, a grow after it adds the pods; a rollback
        # to a revision of another replicaCount is a rescale the same way.
        assert notes["helm.sh/hook"] == f"{phase}-upgrade,{phase}-rollback"
        assert notes["helm.sh/hook-weight"] == "0"
        # Kept when it fails (its log says why), replaced by the next run, removed when it succeeds.
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert notes["helm.sh/hook-output-log-policy"] == "hook-succeeded,hook-failed"
        spec = job["spec"]
        assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"
        pod_labels = spec["template"]["metadata"]["labels"]
        assert not selector.items() <= pod_labels.items(), "the Services and the PDB would select the hook pod"
        container = hook_container(job)
        assert container["image"] == "statehouse:0.1.0"
        assert container["command"][:2] == ["python", "-c"]
        assert container["command"][2] == (CHART / "files" / "rescale_hook.py").read_text()
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        env = env_of(container)
        assert env["RESCALE_PHASE"] == phase and env["RESCALE_TO"] == str(after)
        assert env["RESCALE_URLS"].split(",") == [
            f"http://{FULLNAME}-{i}.{FULLNAME}-headless.{NAMESPACE}.svc.cluster.local:8000" for i in range(after)
        ]
        assert env["STATEHOUSE_URLS"] == env["RESCALE_URLS"].split(",")[0]
        assert env["RESCALE_WAIT"] == "300" and env["RESCALE_SHARED_STORAGE"] == "true"
        assert env["RESCALE_STATEFULSET_REPLICAS"] == ""  # Helm's lookup finds nothing offline
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        if auth:
            assert env["RESCALE_TOKENS_FILE"] == "/etc/statehouse/auth/tokens"
            assert mounts["auth-tokens"]["mountPath"] == "/etc/statehouse/auth" and mounts["auth-tokens"]["readOnly"]
            secret = volumes["auth-tokens"]["secret"]
            assert secret["secretName"] == f"{FULLNAME}-auth"
            assert secret["items"] == [{"key": "api-tokens", "path": "tokens"}]
            assert not any("TOKEN" in name for name in env if name != "RESCALE_TOKENS_FILE")  # not in the env
        else:
            assert "RESCALE_TOKENS_FILE" not in env and "auth-tokens" not in volumes


def test_hooks_follow_the_values(chart: hp.Chart) -> None:
    """Off with ``rescale.enabled: false`` and during the offline procedure (``adoptTopology``); on
    install they render too (a rollback to that revision runs them) but no install event runs them;
    without S3 they are rendered to refuse a changed count before anything moves."""
    assert hooks(render_upgrade(chart, {"replicaCount": 3, "rescale": {"enabled": False}})) == {}
    assert hooks(render_upgrade(chart, {"replicaCount": 3, "adoptTopology": True, "topologyVersion": 2})) == {}
    installed = chart.render(values={"replicaCount": 3}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = [d for p, t in installed.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) == 2
    assert all("install" not in j["metadata"]["annotations"]["helm.sh/hook"] for j in jobs)
    local = hooks(render_upgrade(chart, {"replicaCount": 3, "rescale": {"waitSeconds": 42}}))
    env = env_of(hook_container(local["pre"]))
    assert env["RESCALE_SHARED_STORAGE"] == "false" and env["RESCALE_WAIT"] == "42"


# -- running the rendered containers ---------------------------------------------------------------


def free_decade() -> int:
    """A D such that ports D0..D9 are free: replica i listens on D*10+i, so one URL template with
    {index} (``http://127.0.0.1:D{index}``) names them all, as the chart's headless names do. Below
    the ephemeral range (free_port's), and drawn at random so that tests running at once (pytest-xdist)
    do not reach for the same one."""
    draw = random.Random()
    for _attempt in range(200):
        decade = draw.randrange(2000, 3200)
        try:
            for i in range(10):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", decade * 10 + i))
        except OSError:
            continue
        return decade
    raise AssertionError("no free decade of ports")


class Cluster:
    """What stands in for the cluster: the headless Service's names mapped to local replicas (replica
    i on port D*10+i), and the pods of the rendered StatefulSet run as a harness replica set with
    the environment the chart gives them (the shared checkpoint directory in place of S3)."""

    def __init__(self, root: Path, auth: bool = False) -> None:
        self.decade = free_decade()
        storage = {"STATEHOUSE_CHECKPOINT_DIR": str(root / "checkpoints")}
        self.replicas = ReplicaSet(root / "replicas", storage)
        self.root = root
        self.auth = auth

    def local(self, text: str) -> str:
        """``text`` with every headless-Service URL (and the {index} template) made a local one."""
        return POD_URL.sub(lambda m: f"http://127.0.0.1:{self.decade}{m.group(1)}", text)

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.decade}{index}"

    def launch_pod(self, docs: list[dict[str, Any]], index: int) -> tuple[int, ServerProcess]:
        """Replica ``index`` with the rendered StatefulSet's topology settings (its count, the set's
        id, the advertised URLs, a topology version if any), on its own data directory, which a
        restart with other settings finds as it left it; launched, not awaited."""
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        env = {"STATEHOUSE_REPLICA_INDEX": str(index), "STATEHOUSE_BACKEND": "rocksdb", **self.replicas.storage}
        for var in container["env"]:
            if var["name"] in TOPOLOGY_SETTINGS:
                env[var["name"]] = var["value"]
            elif var["name"] == "STATEHOUSE_REPLICA_URLS":
                env[var["name"]] = self.local(var["value"])
        if self.auth:
            env["STATEHOUSE_API_TOKENS"] = ",".join(TOKENS)
        return index, launch_server(self.replicas.root / f"pod-{index}", env, port=self.decade * 10 + index)

    def await_pods(self, launched: list[tuple[int, ServerProcess]]) -> list[ServerProcess]:
        """The launched pods, once each is live (podManagementPolicy: Parallel), as the set's replicas."""
        servers = [await_ready(server, probe="/healthz") for _index, server in launched]
        for server in servers:  # the answer came from this process, not from another that holds the port
            bound = f"Uvicorn running on {server.url} "
            deadline = time.monotonic() + 30
            while bound not in server.log():
                assert server.process.poll() is None and time.monotonic() < deadline, server.log()
                time.sleep(0.05)
        for (index, _launched), server in zip(launched, servers, strict=True):
            if index < len(self.replicas.servers):
                self.replicas.servers[index] = server
            else:
                assert index == len(self.replicas.servers)
                self.replicas.servers.append(server)
        return servers

    def start_pods(self, docs: list[dict[str, Any]], indexes: list[int]) -> list[ServerProcess]:
        return self.await_pods([self.launch_pod(docs, index) for index in indexes])

    def run_hook(
        self, docs: list[dict[str, Any]], phase: str, timeout: float = 120, **rendered: str
    ) -> subprocess.CompletedProcess:
        """The rendered hook Job's container of ``phase``, run as the kubelet would: its command with
        its environment (the venv's python and ``statehouse`` on PATH), its mounts as directories.
        ``rendered``: values the chart renders only against a cluster (``lookup``)."""
        job = hooks(docs)[phase]
        container = hook_container(job)
        command = [self.local(part) for part in container["command"] + container.get("args", [])]
        assert command[0] == "python"
        command[0] = sys.executable
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEHOUSE_", "AWS_", "RESCALE_"))}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        mounts = {m["mountPath"]: self.root / f"hook-{phase}" / m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
        for local in mounts.values():
            local.mkdir(parents=True, exist_ok=True)
            secret = volumes[local.name].get("secret")
            if secret:
                (data,) = [
                    d["data"] for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == secret["secretName"]
                ]
                for item in secret["items"]:
                    (local / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
        env["TMPDIR"] = str(mounts["/tmp"])
        for var in container["env"]:
            value = self.local(var["value"])
            for path, local in mounts.items():
                if value.startswith(path + "/"):
                    value = str(local) + value[len(path) :]
            env[var["name"]] = rendered.get(var["name"], value)
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def stop(self) -> None:
        self.replicas.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.http
@pytest.mark.slow
def test_upgrade_hooks_grow_and_shrink_live(chart: hp.Chart, cluster: Cluster) -> None:
    two = render_upgrade(chart, {"replicaCount": 2, "s3": S3})
    three = render_upgrade(chart, {"replicaCount": 3, "s3": S3})
    seeds = [server.url for server in cluster.start_pods(two, [0, 1])]
    assert seeds == [cluster.url(0), cluster.url(1)]
    with StatehouseClient(seeds) as client:
        client.create_job(JOB, MAX_PARALLELISM).register(STATE, "list")

    with Writers(seeds, [*seeds, cluster.url(2)], JOB, STATE, KEYS) as writers:
        writers.progress()

        # helm upgrade --set replicaCount=3: the pre-upgrade hook leaves a grow to the post-upgrade one,
        # the StatefulSet starts pod 2 (empty, with the new template), the post-upgrade hook moves.
        pre = cluster.run_hook(three, "pre")
        assert pre.returncode == 0, pre.stderr
        assert "growing 2 -> 3 replicas after the upgrade" in pre.stderr
        cluster.start_pods(three, [2])
        grown = cluster.run_hook(three, "post")
        assert grown.returncode == 0, grown.stdout + grown.stderr
        assert "rescaled 2 -> 3 replicas live (topology version 2)" in grown.stdout
        writers.progress()
        again = cluster.run_hook(three, "post")  # a re-run (or an upgrade keeping replicaCount) moves nothing
        assert again.returncode == 0, again.stderr
        assert last_line(again).endswith("the replica set has 3 replicas (topology version 2): nothing to move")

        # helm upgrade --set replicaCount=2: the pre-upgrade hook moves the state off pod 2 while it
        # runs; then the StatefulSet removes it, and the post-upgrade hook has nothing left to do.
        shrunk = cluster.run_hook(two, "pre")
        assert shrunk.returncode == 0, shrunk.stdout + shrunk.stderr
        assert "rescaled 3 -> 2 replicas live (topology version 3)" in shrunk.stdout
        writers.progress()
        assert httpx.get(f"{cluster.url(2)}/v1/topology", timeout=10).json()["retired"] is True
        cluster.replicas.servers.pop().stop()
        for phase in ("post", "pre"):
            again = cluster.run_hook(two, phase)
            assert again.returncode == 0, again.stderr
            assert last_line(again).endswith("the replica set has 2 replicas (topology version 3): nothing to move")
        writers.progress()

    writers.check(seeds)
    assert misplaced(seeds, JOB, [STATE], MAX_PARALLELISM, count=2) == {STATE: []}

    # The pods after the moves, restarted on their volumes: pod 0 deleted and made again from the
    # upgraded template (OnDelete), pod 1's container restarted in a pod that kept the template from
    # before the shrink (3 replicas). Both serve the layout the move recorded; nothing is lost.
    for server in cluster.replicas.servers:
        server.stop()
    cluster.await_pods([cluster.launch_pod(two, 0), cluster.launch_pod(three, 1)])
    for index in (0, 1):
        assert httpx.get(f"{cluster.url(index)}/readyz", timeout=10).status_code == 200
        shown = httpx.get(f"{cluster.url(index)}/v1/topology", timeout=10).json()
        assert (shown["replica_index"], shown["replica_count"], shown["version"]) == (index, 2, 3)
    writers.check(seeds)

    # An upgrade that keeps replicaCount while replicas are down (a new image for crash-looping pods)
    # is not held by the hooks: one replica answering tells the count, and with none answering the
    # StatefulSet's own count (Helm's lookup, against a cluster) does; without either it fails.
    cluster.replicas.servers[0].stop()  # the seed too
    partly = cluster.run_hook(two, "pre")
    assert partly.returncode == 0, partly.stderr
    assert last_line(partly).endswith(f"no move pending; not answering: {cluster.url(0)}: nothing to move")
    cluster.replicas.servers[1].stop()
    down = cluster.run_hook(two, "pre", RESCALE_STATEFULSET_REPLICAS="2")
    assert down.returncode == 0, down.stderr
    assert last_line(down).endswith(
        "the StatefulSet already runs 2 pods: nothing to move (a move could not run anyway)"
    )
    unknown = cluster.run_hook(two, "pre")
    assert unknown.returncode != 0 and last_line(unknown).startswith("statehouse rescale: "), unknown.stderr


@pytest.mark.http
@pytest.mark.slow
def test_hooks_with_auth_use_the_admin_token_of_the_chart_secret(chart: hp.Chart, tmp_path: Path) -> None:
    """Auth on: the hook reads the chart's token Secret (mounted as a file, not in its environment)
    and runs the CLI with its @admin token; a Secret without one fails before anything moves, with
    one line saying what to add. Without S3 a changed count is refused before the upgrade."""
    cluster = Cluster(tmp_path, auth=True)
    try:
        values = {"replicaCount": 1, "s3": S3, "auth": {"enabled": True, "tokens": TOKENS}}
        one = render_upgrade(chart, values)
        cluster.start_pods(one, [0])
        headers = {"Authorization": "Bearer app-token"}
        admin = {"Authorization": "Bearer ops-token"}
        assert httpx.put(f"{cluster.url(0)}/v1/jobs/{JOB}", json={"max_parallelism": 8}, headers=headers).is_success

        same = cluster.run_hook(one, "pre")
        assert same.returncode == 0, same.stderr
        assert last_line(same).endswith("the replica set has 1 replicas (topology version 1): nothing to move")

        # A grow whose new pod does not start moves nothing and says which pod to look at.
        early = cluster.run_hook(
            render_upgrade(chart, {**values, "replicaCount": 2, "rescale": {"waitSeconds": 1}}), "post"
        )
        assert early.returncode == 1
        assert last_line(early).startswith(f"statehouse rescale hook: new replica 1 ({cluster.url(1)}) did not start")

        two = render_upgrade(chart, {**values, "replicaCount": 2})
        cluster.start_pods(two, [1])
        # A move the command refuses fails the Job with the command's own line, last in its log.
        tiny = f"{cluster.url(0)}/v1/jobs/tiny"
        assert httpx.put(tiny, json={"max_parallelism": 1}, headers=admin).is_success
        refused = cluster.run_hook(two, "post")
        assert refused.returncode not in (0, None), refused.stderr
        assert last_line(refused).startswith("statehouse rescale: ") and "tiny" in last_line(refused)
        deleted = httpx.delete(tiny, headers=admin)
        assert deleted.is_success, (deleted.text, refused.stdout, refused.stderr)

        grown = cluster.run_hook(two, "post")
        assert grown.returncode == 0, grown.stdout + grown.stderr
        assert "rescaled 1 -> 2 replicas live (topology version 2)" in grown.stdout

        no_admin = render_upgrade(chart, {**values, "auth": {"enabled": True, "tokens": ["app-token:orders"]}})
        refused = cluster.run_hook(no_admin, "pre")
        assert refused.returncode == 1
        assert "holds no @admin token" in last_line(refused)

        local = render_upgrade(chart, {"replicaCount": 1, "auth": {"enabled": True, "tokens": TOKENS}})
        refused = cluster.run_hook(local, "pre")
        assert refused.returncode == 1
        assert "per-replica volumes (s3.enabled=false)" in last_line(refused) and "keep replicaCount=2" in last_line(
            refused
        )
        shown = httpx.get(f"{cluster.url(0)}/v1/topology", headers=headers).json()
        assert (shown["replica_count"], shown["version"], shown["move"]) == (2, 2, None)  # nothing moved
    finally:
        cluster.stop()
