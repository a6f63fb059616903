"""Specification: containers as Kubernetes pods, against an API server that is not ours.

The launcher's pure steps first: the pod it sends (labels, the owner
reference, ``restartPolicy: Never``, a grace period longer than a lease, a
template's fields kept), the names it gives, how a watch's events change
what it knows and when it must list again (410 Gone), which phases count as
live, which finished pods it deletes.

Then the launcher against fabric8's mock API server (CRUD mode, in a JVM of
its own; ``tests/k8s_api.py``): pods created, watched through their phases
and deleted; a name taken (409) adopted, replaced or refused; a new launcher
answering for an earlier one's pods; an API server out of reach or an owner
pod missing refused in one line; and the mock server itself answering while
watches are dropped mid-burst (its own flaw, fixed in ``java/.../k8smock``).

Then the coordinator with it: a test kubelet runs each pod's command as a
real process (stand-in containers that heartbeat), so a pod deleted by the
operator (``kubectl delete pod``) is a container gone, failed over into a
new pod; a launch the API server refuses is an event on the status page and
a later try, never the coordinator's end. `make test-all` runs the click-count
job for real under ``spark-elastic job run --launcher kubernetes``, a pod of
it deleted mid-run, its output exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from jobs import (
    APPLY_DEADLINE_S,
    CHANGE_DEADLINE_S,
    RECORDS,
    RunningJob,
    all_applied,
    counts_in_key_order,
    produce,
    published_batches,
)
from k8s_api import ApiServer, Kubelet, running_api_server
from kafka_jvm import stop
from pyspark.sql import SparkSession
from standins import HERE, Coordinator, crash, wait_until, worker_bridge

from spark_elastic import EmbeddedLog
from spark_elastic.runtime.coordinator.launchers import LaunchError, LocalLauncher
from spark_elastic.runtime.coordinator.launchers.kubernetes import (
    CONTAINER_LABEL,
    JOB_LABEL,
    POD_VERBS,
    KubernetesLauncher,
    PodView,
    applied,
    finished_to_delete,
    is_live,
    listed,
    pod_manifest,
    pod_name,
    reason_of,
)
from spark_elastic.runtime.coordinator.launchers.namespaces import NamespaceLauncher

NAMESPACE = "jobs"
IMAGE = "spark-elastic:test"
OWNER = "coordinator-0"
TOKEN = "kubernetes-spec"
TOKEN_ENV = "SPARK_ELASTIC_TOKEN"


def manifest(**overrides: Any) -> dict[str, Any]:
    given: dict[str, Any] = {
        "job": "clicks",
        "container_id": "clicks-c7",
        "image": IMAGE,
        "command": ["spark-elastic", "container", "run"],
        "env": {"EXECUTION_ENV_CONTAINER_ID": "clicks-c7", "SPARK_ELASTIC_TOKEN": "t"},
        "grace_s": 17.5,
        "owner": {"name": OWNER, "uid": "u-1"},
    }
    return pod_manifest(**{**given, **overrides})


def pod(uid: str, phase: str, container_id: str = "clicks-c1", **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": pod_name(container_id),
            "uid": uid,
            "resourceVersion": meta.pop("rv", "5"),
            "annotations": {"spark-elastic/container-id": container_id},
            **meta,
        },
        "status": {"phase": phase},
    }


# The pod it sends


def test_a_pod_runs_the_container_command_labelled_owned_never_restarted_with_a_long_grace() -> (
    None
):
    sent = manifest()
    assert sent["apiVersion"] == "v1"
    assert sent["kind"] == "Pod"
    meta, spec = sent["metadata"], sent["spec"]
    assert meta["name"] == "clicks-c7"
    assert meta["labels"][JOB_LABEL] == "clicks"
    assert meta["labels"][CONTAINER_LABEL] == "clicks-c7"
    assert meta["annotations"]["spark-elastic/container-id"] == "clicks-c7"
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": OWNER, "uid": "u-1", "blockOwnerDeletion": True}
    ]
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 18  # never shorter than asked
    (container,) = spec["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == ["spark-elastic", "container", "run"]
    assert {e["name"]: e.get("value") or e["valueFrom"] for e in container["env"]} == {
        "EXECUTION_ENV_CONTAINER_ID": "clicks-c7",
        "SPARK_ELASTIC_TOKEN": "t",
        # Executors on a k8s:// master reach the driver at its pod's address.
        "SPARK_LOCAL_IP": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    # Unless the job says otherwise.
    mine = manifest(env={"SPARK_LOCAL_IP": "10.0.0.9"})["spec"]["containers"][0]["env"]
    assert [e for e in mine if e["name"] == "SPARK_LOCAL_IP"] == [
        {"name": "SPARK_LOCAL_IP", "value": "10.0.0.9"}
    ]
    assert "ownerReferences" not in manifest(owner=None)["metadata"]


def test_a_template_keeps_its_own_fields_and_the_launcher_s_win() -> None:
    template = {
        "metadata": {"labels": {"team": "ads", JOB_LABEL: "other"}, "uid": "old"},
        "spec": {
            "restartPolicy": "Always",
            "nodeSelector": {"disk": "ssd"},
            "containers": [
                {"name": "sidecar", "image": "envoy"},
                {
                    "name": "container",
                    "image": "wrong",
                    "args": ["--nope"],
                    "resources": {"limits": {"memory": "4Gi"}},
                    "env": [{"name": "LANG", "value": "C"}, {"name": "SPARK_ELASTIC_TOKEN"}],
                },
            ],
        },
    }
    sent = manifest(template=template, service_account="spark")
    assert sent["metadata"]["labels"]["team"] == "ads"
    assert sent["metadata"]["labels"][JOB_LABEL] == "clicks"
    assert "uid" not in sent["metadata"]
    assert sent["spec"]["restartPolicy"] == "Never"
    assert sent["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert sent["spec"]["serviceAccountName"] == "spark"
    sidecar, main = sent["spec"]["containers"]
    assert sidecar == {"name": "sidecar", "image": "envoy"}
    assert main["image"] == IMAGE
    assert "args" not in main
    assert main["resources"] == {"limits": {"memory": "4Gi"}}
    env = [(e["name"], e.get("value")) for e in main["env"]]
    assert env[0] == ("LANG", "C")
    assert ("SPARK_ELASTIC_TOKEN", "t") in env
    assert ("SPARK_ELASTIC_TOKEN", None) not in env
    assert template["spec"]["restartPolicy"] == "Always"  # the template is not changed


def test_pod_names_are_dns_labels_and_two_ids_never_share_one() -> None:
    assert pod_name("clicks-c12") == "clicks-c12"
    names = {pod_name(i) for i in ("Click_Counts-c1", "click-counts-c1", "click_counts-c1")}
    assert len(names) == 3
    long = pod_name("x" * 100 + "-c1")
    assert len(long) <= 63
    for name in (*names, long):
        assert name == name.lower()
        assert name[0].isalnum()
        assert name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


# What the watch knows


def test_a_list_then_events_say_which_pods_exist_and_where_the_watch_resumes() -> None:
    pods = listed({"items": [pod("a", "Pending")], "metadata": {"resourceVersion": "10"}})
    assert set(pods.by_uid) == {"a"}
    assert pods.resource_version == "10"
    pods = applied(pods, {"type": "MODIFIED", "object": pod("a", "Running", rv="11")})
    assert pods is not None
    assert pods.by_uid["a"].phase == "Running"
    pods = applied(pods, {"type": "ADDED", "object": pod("b", "Pending", "clicks-c2", rv="12")})
    assert pods is not None
    assert set(pods.by_uid) == {"a", "b"}
    pods = applied(pods, {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}})
    assert pods is not None
    assert pods.resource_version == "20"
    assert len(pods.by_uid) == 2
    pods = applied(pods, {"type": "DELETED", "object": pod("a", "Running", rv="21")})
    assert pods is not None
    assert set(pods.by_uid) == {"b"}
    assert pods.resource_version == "21"


def test_a_version_gone_410_or_any_error_means_listing_again() -> None:
    pods = listed({"items": [pod("a", "Running")], "metadata": {"resourceVersion": "10"}})
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    assert applied(pods, gone) is None
    assert applied(pods, {"type": "SURPRISE", "object": {}}) is None
    assert applied(pods, {"type": "ADDED", "object": {"metadata": {}}}) is None


def test_a_pod_is_live_while_it_may_run_that_container() -> None:
    view = PodView.of(pod("a", "Running", "clicks-c1"))
    assert is_live(view, "clicks-c1")
    assert not is_live(view, "clicks-c2")  # a pod is only ever its own container's
    phases = [("Pending", True), ("Unknown", True), ("Succeeded", False), ("Failed", False)]
    for phase, live in phases:
        assert is_live(PodView.of(pod("a", phase)), "clicks-c1") is live, phase
    # Being deleted, it runs until its grace ends: it may still write.
    deleting = pod("a", "Running", deletionTimestamp="2026-01-01T00:00:00Z")
    assert is_live(PodView.of(deleting), "clicks-c1")
    assert not is_live(None, "clicks-c1")


def test_reaping_deletes_succeeded_pods_and_all_failed_but_the_newest() -> None:
    items = [pod("s", "Succeeded", "c-s"), pod("r", "Running", "c-r")]
    items += [
        pod(f"f{i}", "Failed", f"c-f{i}", creationTimestamp=f"2026-01-01T00:00:0{i}Z")
        for i in range(7)
    ]
    items.append(pod("d", "Failed", "c-d", deletionTimestamp="2026-01-01T00:00:00Z"))
    doomed = finished_to_delete(listed({"items": items}), keep_failed=5)
    assert [p.uid for p in doomed] == ["s", "f0", "f1"]


def test_kubernetes_says_why_a_pod_is_not_running_in_codes_not_messages() -> None:
    def waiting(reason: str) -> dict[str, Any]:
        return {
            "containerStatuses": [
                {"name": "container", "state": {"waiting": {"reason": reason, "message": "x"}}}
            ]
        }

    assert reason_of(waiting("ErrImagePull")) == "ErrImagePull"
    assert reason_of(waiting("ContainerCreating")) == ""  # on its way: nothing wrong
    ended = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "message": "x"}}
    assert reason_of({"containerStatuses": [{"name": "container", "state": ended}]}) == (
        "OOMKilled (exit code 137)"
    )
    assert reason_of({"phase": "Failed", "reason": "Evicted", "message": "disk"}) == "Evicted"
    unscheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    assert reason_of({"conditions": [unscheduled]}) == "Unschedulable"
    assert reason_of({"phase": "Running"}) == ""


# Against the API server


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    with running_api_server() as server:
        yield server


@pytest.fixture
def namespace(api: ApiServer, request: pytest.FixtureRequest) -> str:
    """A namespace of the spec's own (the mock server needs none made)."""
    return f"ns-{abs(hash(request.node.name)) % 10**8}"


def owner_pod(api: ApiServer, namespace: str) -> dict[str, Any]:
    return api.create_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": OWNER},
            "spec": {"containers": [{"name": "coordinator", "image": IMAGE}]},
        },
    )


def launcher_on(api: ApiServer, namespace: str, **given: Any) -> KubernetesLauncher:
    return KubernetesLauncher(namespace, IMAGE, "clicks", 17.0, server=api.url, **given).start()


def seen(launcher: KubernetesLauncher, handle: str, phase: str | None) -> bool:
    """Whether the launcher's watch shows the pod in ``phase`` (None: gone)."""
    view = launcher.pod_of(handle)
    return view is None if phase is None else view is not None and view.phase == phase


def test_a_pod_is_created_owned_watched_through_its_phases_and_deleted(
    api: ApiServer, namespace: str
) -> None:
    owner = owner_pod(api, namespace)
    launcher = launcher_on(api, namespace, owner_pod=OWNER)
    try:
        handle = launcher.launch("clicks-c1", {"EXECUTION_ENV_CONTAINER_ID": "clicks-c1"})
        (made,) = api.pods(namespace, f"{JOB_LABEL}=clicks")
        assert made["metadata"]["uid"] == handle
        reference = made["metadata"]["ownerReferences"][0]
        assert (reference["name"], reference["uid"]) == (OWNER, owner["metadata"]["uid"])
        assert launcher.alive(handle, "clicks-c1")  # before the watch has seen it too
        assert not launcher.alive(handle, "clicks-c2")
        api.set_phase(namespace, made["metadata"]["name"], "Running")
        wait_until("the watch sees it run", lambda: seen(launcher, handle, "Running"), 10)
        assert launcher.alive(handle, "clicks-c1")
        api.set_phase(namespace, made["metadata"]["name"], "Failed")
        wait_until("the watch sees it fail", lambda: seen(launcher, handle, "Failed"), 10)
        assert not launcher.alive(handle, "clicks-c1")
        launcher.terminate(handle, "clicks-c1")
        wait_until("the pod is deleted", lambda: not api.pods(namespace, f"{JOB_LABEL}=clicks"), 10)
        wait_until("the watch sees it gone", lambda: seen(launcher, handle, None), 10)
        assert not launcher.alive(handle, "clicks-c1")
        assert launcher.failures == []
    finally:
        launcher.close()


def test_a_name_taken_is_adopted_if_it_runs_that_container_replaced_if_finished_else_refused(
    api: ApiServer, namespace: str
) -> None:
    launcher = launcher_on(api, namespace)
    try:
        first = launcher.launch("clicks-c1", {})
        # A create whose answer was lost is sent again: the pod that runs it is taken.
        assert launcher.launch("clicks-c1", {}) == first
        api.set_phase(namespace, pod_name("clicks-c1"), "Succeeded")
        wait_until("the watch sees it end", lambda: seen(launcher, first, "Succeeded"), 10)
        second = launcher.launch("clicks-c1", {})
        assert second != first
        assert [p["metadata"]["uid"] for p in api.pods(namespace)] == [second]
        # Another container's pod under that name (made by hand, say): refused, one line.
        api.create_pod(
            namespace,
            manifest(container_id="clicks-c2")
            | {
                "metadata": {
                    "name": pod_name("clicks-c3"),
                    "annotations": {"spark-elastic/container-id": "clicks-c2"},
                }
            },
        )
        taken = r"^pod clicks-c3 exists .* runs container clicks-c2, not clicks-c3$"
        with pytest.raises(LaunchError, match=taken):
            launcher.launch("clicks-c3", {})
    finally:
        launcher.close()


def test_a_new_launcher_answers_for_the_pods_an_earlier_one_made_and_reaps_finished_ones(
    api: ApiServer, namespace: str
) -> None:
    earlier = launcher_on(api, namespace)
    try:
        running = earlier.launch("clicks-c1", {})
        done = earlier.launch("clicks-c2", {})
    finally:
        earlier.close()
    api.set_phase(namespace, pod_name("clicks-c1"), "Running")
    api.set_phase(namespace, pod_name("clicks-c2"), "Succeeded")
    later = launcher_on(api, namespace)  # a restarted coordinator's, or a standby's
    try:
        # Open already: the mock server, unlike a real one, ignores the list's resource
        # version, so a pod deleted before the watch opened would never be seen gone (stop
        # 65's red run, when start() returned before its watch opened).
        assert later.watching
        assert later.alive(running, "clicks-c1")
        assert not later.alive(done, "clicks-c2")
        later.reap()
        wait_until(
            "the finished pod is deleted",
            lambda: [p["metadata"]["uid"] for p in api.pods(namespace)] == [running],
            10,
        )
        later.kill(running, "clicks-c1", 9)
        wait_until("the killed pod is deleted", lambda: api.pods(namespace) == [], 10)
        wait_until("the watch sees it gone", lambda: not later.alive(running, "clicks-c1"), 10)
    finally:
        later.close()


def test_an_api_server_out_of_reach_or_an_owner_pod_missing_is_one_line(
    api: ApiServer, namespace: str
) -> None:
    with pytest.raises(LaunchError) as missing:
        launcher_on(api, namespace, owner_pod="nobody")
    assert "owner pod nobody" in str(missing.value)
    assert "404" in str(missing.value)
    assert "\n" not in str(missing.value)
    with pytest.raises(LaunchError) as unreachable:
        KubernetesLauncher(namespace, IMAGE, "clicks", 17.0, server="http://127.0.0.1:9").start(
            timeout_s=10
        )
    assert "http://127.0.0.1:9" in str(unreachable.value)
    assert "\n" not in str(unreachable.value)


class ListsButWillNotWatch(http.server.BaseHTTPRequestHandler):
    """An API server that lists the job's pods (none) and answers every watch with
    :attr:`watch_status`: 403 as Kubernetes' RBAC does for a role without the ``watch``
    verb, 500 as one that is failing."""

    watch_status = 403

    def do_GET(self) -> None:
        if "watch=true" in self.path:
            code = self.watch_status
            body = {"kind": "Status", "code": code, "message": "pods is forbidden: cannot watch"}
        else:
            code = 200
            body = {"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": []}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def refusing_watches(status: int) -> Iterator[str]:
    handler = type("Refusing", (ListsButWillNotWatch,), {"watch_status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_api_server_that_lists_but_will_not_watch_is_refused_at_start_in_one_line() -> None:
    with refusing_watches(403) as url, pytest.raises(LaunchError) as refused:
        KubernetesLauncher("jobs", IMAGE, "clicks", 17.0, server=url).start(timeout_s=30)
    message = str(refused.value)
    # Said at the first refusal (a role does not heal), not at start()'s deadline.
    assert f"{url} lists the job's pods in namespace jobs but refuses to watch them" in message
    assert "HTTP 403" in message
    assert "\n" not in message
    # A watch failing otherwise is tried again until the deadline, then said with its cause.
    with refusing_watches(500) as url, pytest.raises(LaunchError) as failing:
        KubernetesLauncher("jobs", IMAGE, "clicks", 17.0, server=url).start(timeout_s=2)
    message = str(failing.value)
    assert f"{url} listed the job's pods but opened no watch on them within 2 s" in message
    assert "HTTP 500" in message
    assert "\n" not in message


ANSWER_DEADLINE_S = 10
"""A deadline for the specs' API server's answer (the mock's stall was 30 s), not a measure."""


def test_the_specs_api_server_answers_while_watches_are_dropped_mid_burst() -> None:
    """The harness's own spec: fabric8's mock, left as it is, stopped answering for 30 s when
    a watch's socket closed while it was sending that watch an event (ClosesOffTheLoop.java).
    A fresh server each time: the stall showed on a server's first bursts, not on a warm one."""

    def a_pod(name: str) -> dict[str, Any]:
        spec = {"containers": [{"name": "c", "image": IMAGE}]}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    async def burst_then_list(url: str, namespace: str) -> None:
        pods = f"{url}/api/v1/namespaces/{namespace}/pods"
        async with aiohttp.ClientSession() as session:
            watch = await session.ws_connect(pods.replace("http", "ws", 1) + "?watch=true")

            async def create(i: int) -> None:
                async with session.post(pods, json=a_pod(f"p{i}")) as response:
                    await response.read()

            creates = [asyncio.create_task(create(i)) for i in range(40)]
            await asyncio.sleep(0.01)
            watch_connection = watch._response.connection  # type: ignore[attr-defined]
            watch_connection.transport.abort()  # dropped, as a coordinator that dies drops it
            await asyncio.gather(*creates, return_exceptions=True)
        async with (
            aiohttp.ClientSession() as session,
            session.get(pods, timeout=aiohttp.ClientTimeout(total=ANSWER_DEADLINE_S)) as response,
        ):
            assert response.status == 200
            await response.read()

    for attempt in range(2):
        with running_api_server() as server:
            try:
                asyncio.run(burst_then_list(server.url, f"burst-{attempt}"))
            except TimeoutError:
                pytest.fail(f"no answer within {ANSWER_DEADLINE_S} s of a watch dropped mid-burst")


# The coordinator with it


class RefusingFirst:
    """The launcher protocol around another one whose first ``refusals`` launches the
    platform refuses (a quota, an API server out of reach)."""

    def __init__(self, inner: Any, refusals: int) -> None:
        self.inner, self.refusals = inner, refusals

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        if self.refusals > 0:
            self.refusals -= 1
            raise LaunchError("pods is forbidden: exceeded quota: pods=10")
        return str(self.inner.launch(container_id, env))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def stand_in(command: Any) -> list[str]:
    assert list(command) == ["spark-elastic", "container", "run"]
    return [sys.executable, str(HERE / "standin_container.py")]


@contextlib.contextmanager
def node(kind: str, tmp_path: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """What runs the pods, and where the coordinator listens for them: local processes
    (the coordinator on loopback), or each pod a host of its own on a bridge (the
    coordinator on the bridge, with a token; the job's directory not mounted in a pod)."""
    if kind == "processes":
        yield LocalLauncher(tmp_path / "node-logs"), {}
        return
    with worker_bridge("sek", 76) as bridge:
        hosts = NamespaceLauncher(
            bridge, tmp_path / "node-logs", prefix=f"sek{os.getpid() % 10_000}", hidden=(tmp_path,)
        )
        try:
            yield hosts, {"host": bridge.gateway, "token": TOKEN, "env": {TOKEN_ENV: TOKEN}}
        finally:
            hosts.remove_all()


@pytest.mark.parametrize("runs_pods", ["processes", "hosts"])
def test_containers_run_as_pods_and_a_pod_deleted_is_failed_over_into_a_new_one(
    api: ApiServer, namespace: str, tmp_path: Path, runs_pods: str
) -> None:
    owner_pod(api, namespace)
    pods = launcher_on(api, namespace, owner_pod=OWNER)
    try:
        with node(runs_pods, tmp_path) as (runner, listening):
            coordinator = Coordinator(tmp_path, launcher=RefusingFirst(pods, 1), **listening)
            kubelet = Kubelet(api, namespace, runner, runs=stand_in)
            with kubelet, coordinator.server.running_in_thread():
                pods_run_their_containers(api, namespace, coordinator, kubelet)
    finally:
        pods.close()  # the kubelet killed what it ran as it ended


def pods_run_their_containers(
    api: ApiServer, namespace: str, coordinator: Coordinator, kubelet: Kubelet
) -> None:
    """The story: two containers in pods, after a refused launch; one pod deleted."""
    rows = wait_until("two containers run in pods", lambda: running_pods(coordinator, 2))
    events = coordinator.status()["events"]
    refused = [e for e in events if e["kind"] == "launch-failed"]
    assert refused
    assert "exceeded quota" in refused[0]["detail"]
    assert "tried again in 2 s" in refused[0]["detail"]
    by_uid = {p["metadata"]["uid"]: p for p in api.pods(namespace, f"{JOB_LABEL}=clicks")}
    for row in rows.values():
        made = by_uid[row["handle"]]
        assert made["metadata"]["ownerReferences"][0]["name"] == OWNER
        assert made["status"]["phase"] == "Running"
    victim = sorted(rows)[0]
    api.delete_pod(namespace, by_uid[rows[victim]["handle"]]["metadata"]["name"])

    def replaced() -> dict[str, Any] | None:
        now = running_pods(coordinator, 2)
        return now if now and victim not in now else None

    after = wait_until("the deleted pod's container is failed over", replaced, 60)
    assert all(row["handle"] in live_uids(api, namespace) for row in after.values())
    events = coordinator.status()["events"]
    assert any(e["kind"] == "expire" and e["container"] == victim for e in events)
    assert any(e["kind"] == "failover" and f"of {victim} " in e["detail"] for e in events)
    # No other container was failed over (one pod each, and the victim's successor's).
    assert len(kubelet.started) == 3, [(e["kind"], e["container"], e["detail"]) for e in events]
    assert not kubelet.errors


def test_an_api_server_out_of_reach_is_an_event_and_the_containers_run_on(
    tmp_path: Path,
) -> None:
    # An API server of the spec's own, stopped while the job runs: the launcher's watch
    # fails, the coordinator says so on its status page, and no container is taken for gone.
    with running_api_server() as own:
        owner_pod(own, NAMESPACE)
        pods = launcher_on(own, NAMESPACE, owner_pod=OWNER)
        try:
            kubelet = Kubelet(own, NAMESPACE, LocalLauncher(tmp_path / "node-logs"), runs=stand_in)
            coordinator = Coordinator(tmp_path, launcher=pods)
            with kubelet, coordinator.server.running_in_thread():
                before = wait_until("two containers in pods", lambda: running_pods(coordinator, 2))
                stop(own.pid)

                def said() -> list[str]:
                    events = coordinator.status()["events"]
                    return [e["detail"] for e in events if e["kind"] == "launcher"]

                (first, *_) = wait_until("the watch's failure on the status page", said, 30)
                assert first.startswith("watching the job's pods: ")
                # Said once, though the watch tries again and again (the second try's
                # failure, 0.6 s after the first, is long drained by the third's).
                wait_until("the watch tried again", lambda: len(pods.failures) >= 3, 30)
                assert len(said()) == 1
                # Leases, not the API server, say whether a container runs.
                assert running_pods(coordinator, 2).keys() == before.keys()
                assert all(pods.alive(r["handle"], c) for c, r in before.items())
                # Its pods cannot be deleted now: the coordinator leaves them as a crash
                # would (a clean stop waits for them), and the kubelet ends them.
                crash(coordinator)
        finally:
            pods.close()


def test_an_image_that_cannot_be_pulled_is_the_failover_s_reason(tmp_path: Path) -> None:
    # The kubelet cannot pull the image: the pod stays Pending, saying ErrImagePull; the
    # container does not register within its start-up bound and is failed over, the event
    # naming the cause the operator must fix.
    with running_api_server() as own:
        pods = launcher_on(own, NAMESPACE)
        try:
            kubelet = Kubelet(
                own,
                NAMESPACE,
                LocalLauncher(tmp_path / "node-logs"),
                pulls=lambda i: "ErrImagePull",
            )
            coordinator = Coordinator(tmp_path, containers=1, launcher=pods, startup_s=2)
            with kubelet, coordinator.server.running_in_thread():

                def expired() -> list[str]:
                    events = coordinator.status()["events"]
                    return [e["detail"] for e in events if e["kind"] == "expire"]

                (first, *_) = wait_until("the pod failed over", expired, 30)
                assert first.startswith("it did not register within 2 s of its launch")
                assert "(pod Pending: ErrImagePull)" in first
                crash(coordinator)
        finally:
            pods.close()


def running_pods(coordinator: Coordinator, count: int) -> dict[str, Any] | None:
    rows = {
        c["containerId"]: c for c in coordinator.status()["containers"] if c["state"] == "running"
    }
    return rows if len(rows) == count else None


def live_uids(api: ApiServer, namespace: str) -> set[str]:
    return {
        p["metadata"]["uid"]
        for p in api.pods(namespace)
        if (p.get("status") or {}).get("phase") in ("Pending", "Running")
    }


# The real job (`make test-all`)


def container_command(command: Any) -> list[str]:
    """The image's ``spark-elastic container run``, as this interpreter runs it."""
    assert list(command) == ["spark-elastic", "container", "run"]
    return [sys.executable, "-m", "spark_elastic", "container", "run"]


@pytest.mark.slow
@pytest.mark.long
def test_the_click_count_job_runs_in_pods_and_a_pod_deleted_mid_run_loses_nothing(
    api: ApiServer,
    namespace: str,
    spark: SparkSession,
    start_job: Callable[..., RunningJob],
    clicks: Path,
) -> None:
    # `spark-elastic job run --launcher kubernetes`, its containers real Spark drivers that
    # the kubelet runs as processes; the operator deletes one's pod while it works.
    owner_pod(api, namespace)
    node = LocalLauncher(
        clicks / "node-logs", env={"CLICKS_ROOT": str(clicks), "PYSPARK_PYTHON": sys.executable}
    )
    with Kubelet(api, namespace, node, runs=container_command) as kubelet:
        job = start_job(
            2,
            None,
            0,
            *("--launcher", "kubernetes", "--k8s-server", api.url, "--k8s-image", IMAGE),
            *("--k8s-namespace", namespace, "--k8s-owner-pod", OWNER),
        )
        rows = wait_until("two containers run in pods", lambda: running_pods_of(job, 2))
        victim = min(rows)
        wait_until(
            "a first batch published", lambda: published_batches(job.out, victim), APPLY_DEADLINE_S
        )
        produce(EmbeddedLog(clicks / "log"), RECORDS, 2000)
        name = next(
            p["metadata"]["name"]
            for p in api.pods(namespace)
            if p["metadata"]["uid"] == rows[victim]["handle"]
        )
        api.delete_pod(namespace, name)  # kubectl delete pod
        wait_until(
            "its tasks in a new pod",
            lambda: (now := running_pods_of(job, 2)) and victim not in now,
            CHANGE_DEADLINE_S,
        )
        wait_until("every record applied", all_applied(job, RECORDS + 2000), APPLY_DEADLINE_S)
        assert sorted(set(job.output_rows())) == counts_in_key_order(spark, clicks, 4)
        assert not kubelet.errors


def running_pods_of(job: RunningJob, count: int) -> dict[str, dict[str, Any]] | None:
    rows = job.running_rows()
    return rows if len(rows) == count else None


# The example manifest (docs/kubernetes/coordinator.yaml)

MANIFEST = Path(__file__).parents[2] / "docs" / "kubernetes" / "coordinator.yaml"


def example() -> dict[str, dict[str, Any]]:
    import yaml

    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_the_example_manifest_grants_the_launcher_what_it_does_with_pods() -> None:
    docs = example()
    (rule,) = docs["Role"]["rules"]
    assert rule["apiGroups"] == [""]
    assert rule["resources"] == ["pods"]
    assert set(rule["verbs"]) >= POD_VERBS
    binding = docs["RoleBinding"]
    account = docs["ServiceAccount"]["metadata"]["name"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": docs["Role"]["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert docs["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == account


def test_the_example_manifest_runs_job_run_with_the_kubernetes_launcher_as_it_parses() -> None:
    from spark_elastic.cli.main import build_parser

    pod = example()["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert {env[k]["secretKeyRef"]["key"] for k in ("TOKEN", "STORE")} == {"token", "store"}
    values = {"POD_NAME": "clicks-coordinator-7d9-x", "POD_IP": "10.1.2.3", "TOKEN": "t"}
    values["STORE"] = "postgresql://coordinator:pw@postgres:5432/clicks"
    argv = list(container["args"])
    for name, value in values.items():
        argv = [a.replace(f"$({name})", value) for a in argv]
    assert container["command"] == ["spark-elastic"]
    args = build_parser().parse_args(argv)
    assert (args.command, args.job_command) == ("job", "run")
    assert args.launcher == "kubernetes"
    assert args.k8s_image == container["image"]  # the containers run the coordinator's image
    assert args.k8s_owner_pod == values["POD_NAME"]
    assert args.host == "0.0.0.0"
    assert args.advertise == f"http://{values['POD_IP']}:{args.port}"
    assert args.store.startswith("postgresql://")  # a standby replica shares it
    # The Service reaches the coordinators' port.
    service = example()["Service"]["spec"]
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["ports"]
    assert port["targetPort"] == container["ports"][0]["containerPort"] == args.port
