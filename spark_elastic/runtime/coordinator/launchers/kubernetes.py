"""Containers as Kubernetes pods: :class:`KubernetesLauncher`.

Each container is one pod running ``spark-elastic container run`` as a
client-mode Spark driver (its ``--master`` is the job's: ``local[*]`` in the
pod, or ``k8s://...`` for executors as pods of their own). A pod carries the
job's and the container's labels, an owner reference to the coordinator's
pod (deleting the coordinator's pod deletes its containers' pods),
``restartPolicy: Never`` (the coordinator, not the kubelet, decides what
runs again, and where) and a termination grace period longer than a lease,
so a pod asked to stop finishes its micro-batch in flight.

A container's handle is its pod's UID, so a pod of the same name made later
(another job's, a restarted one) is never taken for it. Liveness is the
pod's phase as a watch on the job's pods reports it (``Pending``,
``Running`` and ``Unknown`` may still run, hence may still write); the watch
lists the pods first and watches from that list's resource version, lists
again when the API server says the version is gone (410) or the watch ends,
and a pod this launcher created counts as live until a list made after its
creation or a ``DELETED`` event says otherwise. The pure steps
(:func:`listed`, :func:`applied`, :func:`pod_manifest`) are what the specs
read.

The API is reached through ``kubernetes_asyncio`` on an event loop of the
launcher's own (a daemon thread), since the coordinator calls a launcher
synchronously on its loop: :meth:`~KubernetesLauncher.launch` waits for the
API server's answer (at most :data:`REQUEST_TIMEOUT_S`); stopping and
killing are sent without waiting; :meth:`~KubernetesLauncher.alive` reads
what the watch last saw. Watches go over a WebSocket, which every API
server serves (and fabric8's mock server, the specs', serves only).

May import: ``kubernetes_asyncio`` and ``aiohttp`` (when a launcher is
made), :mod:`.base`, :mod:`spark_elastic.runtime.protocol`,
:mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.coordinator.launchers.base import LaunchError

__all__ = [
    "CONTAINER_LABEL",
    "JOB_LABEL",
    "POD_VERBS",
    "KubernetesLauncher",
    "PodView",
    "Pods",
    "applied",
    "is_live",
    "listed",
    "pod_manifest",
    "pod_name",
    "reason_of",
]

JOB_LABEL = "spark-elastic/job"
CONTAINER_LABEL = "spark-elastic/container"
CONTAINER_ID_ANNOTATION = "spark-elastic/container-id"
"""The container's id as it is (a label value is cut to 63 characters of a narrower set)."""
LOCAL_IP_ENV = "SPARK_LOCAL_IP"
"""Spark's own setting of the address a driver binds and gives its executors."""
CONTAINER_NAME = "container"
"""The name of the pod's container that runs ``spark-elastic container run``."""

POD_VERBS = frozenset({"create", "get", "list", "watch", "delete"})
"""What the launcher does with pods (its service account's role must allow each): create a
container's, read its own (the owner) and a name taken, list and watch the job's, delete
(stop, kill, reap)."""
LIVE_PHASES = frozenset({"Pending", "Running", "Unknown"})
"""Phases in which a pod's process may run, so may still write (``Unknown``: its node is out
of the API server's reach, not known to be stopped)."""
REQUEST_TIMEOUT_S = 10.0
"""The longest one API request may take (a launch waits for its create)."""
START_TIMEOUT_S = 30.0
"""How long the launcher waits for its first list of the job's pods as it starts."""
RELIST_BACKOFF_S = (0.2, 5.0)
"""A watch that ended is listed again after the first figure, doubling up to the second while
the API server does not answer."""
KILL_GRACE_S = 1
"""A kill is a deletion with 1 s of grace, not 0: a grace of 0 removes the pod object at once
(a force deletion), before its process is stopped, so the coordinator would take it for gone
while it may still write; with 1 s the kubelet kills it and only then is the pod removed."""
KEEP_FAILED = 5
"""Failed pods kept (the newest) for ``kubectl logs`` and ``describe``; older ones and every
succeeded pod are deleted as the launcher reaps."""


def _slug(text: str, limit: int = 63) -> str:
    """``text`` as a DNS-1123 label (lower case, digits, ``-``), with a hash of the original
    when anything had to change, so that two ids never share a name."""
    slug = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if slug == text and len(slug) <= limit:
        return slug
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{slug[: limit - 9].rstrip('-') or 'x'}-{digest}"


def pod_name(container_id: str) -> str:
    """The pod's name for a container: its id as a DNS-1123 label."""
    return _slug(container_id)


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 characters, starting and ending alphanumeric)."""
    return _slug(text)


@dataclass(frozen=True)
class PodView:
    """What the launcher knows of one of the job's pods."""

    name: str
    uid: str
    container_id: str
    """The container it runs (its annotation), or "" for a pod without one."""
    phase: str
    deleting: bool
    """A deletion was asked for (the pod still runs until its grace ends)."""
    created: str = ""
    """``creationTimestamp``, for keeping the newest failed pods."""
    reason: str = ""
    """Why it is not running, as Kubernetes says it (``ErrImagePull``, ``Unschedulable``,
    ``OOMKilled (exit code 137)``...), or "". Codes only, no messages: the coordinator
    counts a container's failures by their cause."""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            container_id=str((meta.get("annotations") or {}).get(CONTAINER_ID_ANNOTATION, "")),
            phase=str((pod.get("status") or {}).get("phase") or "Pending"),
            deleting=bool(meta.get("deletionTimestamp")),
            created=str(meta.get("creationTimestamp") or ""),
            reason=reason_of(pod.get("status") or {}),
        )


def reason_of(status: Mapping[str, Any]) -> str:
    """Why a pod is not running, from its status: its container's waiting or terminated
    state, else the pod's own reason (``Evicted``), else an unschedulable pod's."""
    statuses = status.get("containerStatuses") or ()
    main = next((c for c in statuses if c.get("name") == CONTAINER_NAME), None)
    state = (main or (statuses[0] if statuses else {})).get("state") or {}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
        return str(waiting["reason"])
    ended = state.get("terminated") or {}
    if ended:
        return f"{ended.get('reason') or 'Terminated'} (exit code {ended.get('exitCode', '?')})"
    if status.get("reason"):
        return str(status["reason"])
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or "Unschedulable")
    return ""


@dataclass(frozen=True)
class Pods:
    """The job's pods as of a list and the watch events after it."""

    by_uid: Mapping[str, PodView] = field(default_factory=lambda: MappingProxyType({}))
    resource_version: str = ""
    """Where a watch resumes: the list's, then each event's."""


def listed(response: Mapping[str, Any]) -> Pods:
    """The pods a list returned (a ``PodList`` as JSON), with its resource version."""
    pods = [PodView.of(item) for item in response.get("items") or ()]
    version = str((response.get("metadata") or {}).get("resourceVersion") or "")
    return Pods(MappingProxyType({p.uid: p for p in pods if p.uid}), version)


def applied(pods: Pods, event: Mapping[str, Any]) -> Pods | None:
    """``pods`` after one watch event; None when the watch must start again from a new
    list (an ``ERROR``: 410 Gone, the resource version too old; or anything unknown)."""
    kind = event.get("type")
    obj = event.get("object") or {}
    if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
        return None
    version = str((obj.get("metadata") or {}).get("resourceVersion") or pods.resource_version)
    if kind == "BOOKMARK":
        return replace(pods, resource_version=version)
    pod = PodView.of(obj)
    if not pod.uid:
        return None
    by_uid = dict(pods.by_uid)
    if kind == "DELETED":
        by_uid.pop(pod.uid, None)
    else:
        by_uid[pod.uid] = pod
    return Pods(MappingProxyType(by_uid), version)


def is_live(pod: PodView | None, container_id: str) -> bool:
    """Whether ``pod`` is that container's and its process may run."""
    return pod is not None and pod.container_id == container_id and pod.phase in LIVE_PHASES


def finished_to_delete(pods: Pods, keep_failed: int = KEEP_FAILED) -> list[PodView]:
    """Pods to delete as the launcher reaps: every succeeded one, and the failed ones but the
    newest ``keep_failed`` (not those already being deleted)."""
    done = [p for p in pods.by_uid.values() if not p.deleting]
    failed = sorted((p for p in done if p.phase == "Failed"), key=lambda p: (p.created, p.name))
    succeeded = [p for p in done if p.phase == "Succeeded"]
    return sorted(succeeded, key=lambda p: p.name) + failed[: max(0, len(failed) - keep_failed)]


def pod_manifest(
    *,
    job: str,
    container_id: str,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    grace_s: float,
    owner: Mapping[str, str] | None = None,
    template: Mapping[str, Any] | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    """The pod that runs one container (pure: what :meth:`KubernetesLauncher.launch` sends).

    ``template`` is a pod (a mapping, as a pod template file holds it) whose
    metadata and spec are kept (resources, volumes, node selectors,
    tolerations...); its container named ``container`` (or its first) runs
    the command. The launcher's own fields win: name, labels and annotation
    it relies on, the owner, ``restartPolicy: Never``, the grace period and
    the container's image, command and environment (added after the
    template's).
    """
    pod: dict[str, Any] = json.loads(json.dumps(template or {}))
    meta = pod.setdefault("metadata", {})
    meta.pop("resourceVersion", None)
    meta.pop("uid", None)
    meta["name"] = pod_name(container_id)
    meta["labels"] = {
        **(meta.get("labels") or {}),
        "app.kubernetes.io/name": "spark-elastic",
        JOB_LABEL: label_value(job),
        CONTAINER_LABEL: label_value(container_id),
    }
    meta["annotations"] = {**(meta.get("annotations") or {}), CONTAINER_ID_ANNOTATION: container_id}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner["name"],
                "uid": owner["uid"],
                "blockOwnerDeletion": True,
            }
        ]
    spec = pod.setdefault("spec", {})
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = math.ceil(grace_s)
    if service_account:
        spec["serviceAccountName"] = service_account
    containers = spec.setdefault("containers", [])
    main = next((c for c in containers if c.get("name") == CONTAINER_NAME), None)
    if main is None:
        main = containers[0] if containers else {}
        if not containers:
            containers.append(main)
    main["name"] = main.get("name") or CONTAINER_NAME
    main["image"] = image
    main["command"] = list(command)
    main.pop("args", None)
    given = [e for e in main.get("env") or () if e.get("name") not in env]
    main["env"] = given + [{"name": k, "value": str(v)} for k, v in sorted(env.items())]
    if not any(e.get("name") == LOCAL_IP_ENV for e in main["env"]):
        # The driver binds and names itself by its pod's address: executors on a k8s://
        # master reach it there (a pod's host name resolves nowhere else).
        pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
        main["env"].append({"name": LOCAL_IP_ENV, "valueFrom": pod_ip})
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    return pod


@dataclass
class KubernetesLauncher:
    """Each container a pod (see the module's docstring).

    Call :meth:`start` before anything else (it reaches the API server and
    lists the job's pods: one line if it cannot), and :meth:`close` at the
    end.

    Attributes
    ----------
    namespace
        The Kubernetes namespace of the pods.
    image
        The image the pods run: Python with spark-elastic, pyspark, Java 17
        and the job's code (docs/deployment.md).
    job
        The job's name (its pods' ``spark-elastic/job`` label).
    grace_s
        The pods' termination grace period: longer than a lease, as the
        coordinator kills a container on its own schedule.
    server
        The API server's URL; None: the in-cluster service account, else
        the kubeconfig (``KUBECONFIG``, ``~/.kube/config``).
    owner_pod
        The coordinator's own pod (its name): each container's pod gets an
        owner reference to it. None: no owner.
    command
        The container command.
    env
        Extra environment for every container.
    template
        A pod to start from (:func:`pod_manifest`).
    service_account
        The pods' service account (a ``k8s://`` master needs one that may
        create executor pods).
    """

    namespace: str
    image: str
    job: str
    grace_s: float
    server: str | None = None
    owner_pod: str | None = None
    command: Sequence[str] = ("spark-elastic", "container", "run")
    env: Mapping[str, str] = field(default_factory=dict)
    template: Mapping[str, Any] | None = None
    service_account: str | None = None
    _pods: Pods = field(default_factory=Pods, repr=False)
    _own: dict[str, tuple[str, float]] = field(default_factory=dict, repr=False)
    """UID -> (container id, monotonic time of its creation) of pods this launcher created that
    neither a list made since nor a watch event has shown."""
    _listed_at: float = field(default=-math.inf, repr=False)
    _owner: dict[str, str] | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _api: Any = field(default=None, repr=False)
    _watching: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _reaped: dict[str, float] = field(default_factory=dict, repr=False)
    """UID -> when its deletion was asked, of finished pods."""
    failures: list[str] = field(default_factory=list, repr=False)
    """The last requests sent without waiting that failed (stop, kill, reap, the watch),
    newest last."""
    _unreported: list[str] = field(default_factory=list, repr=False)
    _last_failure: str | None = field(default=None, repr=False)
    _watch_open: bool = field(default=False, repr=False)
    _opened: asyncio.Future[None] | None = field(default=None, repr=False)

    # life

    def start(self, timeout_s: float = START_TIMEOUT_S) -> KubernetesLauncher:
        """Reach the API server, find the owner pod, list the job's pods and watch them;
        returns once the watch is open.

        Why wait for the watch: what the launcher says of a pod is what the watch last
        saw, so a launcher without one answers from a list that ages; and an API server
        that lists but will not watch (a role without the ``watch`` verb) is refused here,
        in one line, not found out from a job that never sees its pods end.

        Raises
        ------
        LaunchError
            No client library, no configuration, the API server out of reach
            or refusing, no such owner pod, no watch within ``timeout_s``: one line.
        """
        try:
            import kubernetes_asyncio  # noqa: F401
        except ImportError:
            raise LaunchError(
                "--launcher kubernetes needs kubernetes_asyncio: "
                "pip install 'spark-elastic[kubernetes]'"
            ) from None
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run_loop, args=(ready,), name="kubernetes-launcher", daemon=True
        )
        thread.start()
        ready.wait()
        try:
            self._call(self._connect(), timeout_s)
        except LaunchError:
            opened = self._opened
            listed_only = opened is not None and not opened.done()
            with self._lock:
                last = f": {self.failures[-1]}" if self.failures else ""
            self.close()
            if listed_only:
                raise LaunchError(
                    f"the Kubernetes API server {self._where()} listed the job's pods but "
                    f"opened no watch on them within {timeout_s:.0f} s{last}"
                ) from None
            raise
        except BaseException:
            self.close()
            raise
        return self

    def _run_loop(self, ready: threading.Event) -> None:
        loop = self._loop
        if loop is None:
            return
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    def close(self) -> None:
        """Stop watching and close the client (the pods run on)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._disconnect(), REQUEST_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        self._loop = None

    def _call(self, coroutine: Any, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        if self._loop is None:
            coroutine.close()
            raise LaunchError("the Kubernetes launcher is not started (start() first) or closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise LaunchError(
                f"the Kubernetes API server {self._where()} did not answer within {timeout_s:.0f} s"
            ) from None

    def _send(self, coroutine: Any, what: str) -> None:
        """Run a request without waiting for it; a failure is kept in :attr:`failures`."""
        if self._loop is None:
            coroutine.close()
            return

        async def guarded() -> None:
            try:
                await coroutine
            except Exception as exc:
                if _status(exc) not in (404, 409):  # gone already, or no longer that pod
                    self._failed(f"{what}: {_reason(exc)}")

        asyncio.run_coroutine_threadsafe(guarded(), self._loop)

    def _failed(self, message: str) -> None:
        with self._lock:
            again = self._last_failure == message
            self._last_failure = message
            self.failures[:] = [*self.failures[-9:], message]
            if again:
                return  # an outage's every retry would say the same: said once
            self._unreported.append(message)
        print(f"spark-elastic coordinator: kubernetes: {message}", file=sys.stderr)

    def drain_failures(self) -> list[str]:
        """The failures since the last call (the coordinator makes each an event, so the
        operator sees an API server out of reach on the status page, not only in a log)."""
        with self._lock:
            drained, self._unreported = self._unreported[-10:], []
        return drained

    def _where(self) -> str:
        return self.server or "(in-cluster or kubeconfig)"

    async def _connect(self) -> None:
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if self.server:
                configuration.host = self.server.rstrip("/")
            else:
                try:
                    config.load_incluster_config(  # type: ignore[no-untyped-call]
                        client_configuration=configuration
                    )
                except config.ConfigException:
                    await config.load_kube_config(client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            raise LaunchError(
                f"--launcher kubernetes: no API server to reach (neither in a pod nor a "
                f"kubeconfig; or give --k8s-server): {exc}"
            ) from None
        self._api = client.ApiClient(configuration)
        core = client.CoreV1Api(self._api)
        try:
            if self.owner_pod:
                owner = await core.read_namespaced_pod(
                    self.owner_pod, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
                )
                self._owner = {"name": owner.metadata.name, "uid": owner.metadata.uid}
            await self._list()
        except Exception as exc:
            await self._api.close()
            raise LaunchError(
                f"the Kubernetes API server {configuration.host} refused or was out of reach "
                f"({'owner pod ' + self.owner_pod + ', ' if self.owner_pod else ''}namespace "
                f"{self.namespace}): {_reason(exc)}"
            ) from None
        self._opened = asyncio.get_running_loop().create_future()
        self._watching = asyncio.get_running_loop().create_task(self._watch())
        await asyncio.shield(self._opened)

    async def _disconnect(self) -> None:
        # The connections first, the watch's among them, so that it ends without a close
        # handshake: a coordinator on its way out has no use for one.
        if self._api is not None:
            await self._api.close()
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(BaseException):
                await self._watching

    # the watch

    def _selector(self) -> str:
        return f"{JOB_LABEL}={label_value(self.job)}"

    async def _list(self) -> None:
        began = time.monotonic()
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        response = await self._get_json(path, {"labelSelector": self._selector()})
        pods = listed(response)
        with self._lock:
            self._pods = pods
            self._listed_at = began
            self._last_failure = None  # it answers again: a new failure is news
            # Created before this list began and not in it: gone.
            for uid, (_, at) in list(self._own.items()):
                if at < began or uid in pods.by_uid:
                    del self._own[uid]

    async def _get_json(self, path: str, query: Mapping[str, str]) -> Any:
        from kubernetes_asyncio import client

        headers: dict[str, str] = {"Accept": "application/json"}
        await self._api.update_params_for_auth(headers, [], ["BearerToken"])
        url = f"{self._api.configuration.host}{path}?{urllib.parse.urlencode(query)}"
        session = self._api.rest_client.pool_manager
        async with session.get(url, headers=headers, timeout=REQUEST_TIMEOUT_S) as response:
            body = await response.text()
            if response.status != 200:
                raise client.ApiException(status=response.status, reason=body[:200])
            return json.loads(body)

    async def _watch(self) -> None:
        """List, then watch from the list's version; list again whenever the watch ends."""
        backoff = RELIST_BACKOFF_S[0]
        first = True
        while True:
            try:
                if not first:
                    await self._list()
                first = False
                await self._watch_from(self._pods.resource_version)
                backoff = RELIST_BACKOFF_S[0]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                opened = self._opened
                if opened is not None and not opened.done() and _status(exc) in (401, 403):
                    # Refused before it ever opened: a role, not an outage; trying again
                    # until start()'s deadline would only delay saying so.
                    opened.set_exception(
                        LaunchError(
                            f"the Kubernetes API server {self._where()} lists the job's pods "
                            f"in namespace {self.namespace} but refuses to watch them: "
                            f"{_reason(exc)}"
                        )
                    )
                    return
                self._failed(f"watching the job's pods: {_reason(exc)}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RELIST_BACKOFF_S[1])

    async def _watch_from(self, version: str) -> None:

        headers: dict[str, str] = {}
        await self._api.update_params_for_auth(headers, [], ["BearerToken"])
        query = {"watch": "true", "labelSelector": self._selector()}
        if version:
            query["resourceVersion"] = version
            query["allowWatchBookmarks"] = "true"
        host = self._api.configuration.host
        ws_host = "ws" + host[len("http") :] if host.startswith("http") else host
        url = f"{ws_host}/api/v1/namespaces/{self.namespace}/pods?{urllib.parse.urlencode(query)}"
        session = self._api.rest_client.pool_manager
        async with session.ws_connect(url, headers=headers, heartbeat=30) as socket:
            self._watch_open = True
            if self._opened is not None and not self._opened.done():
                self._opened.set_result(None)
            try:
                await self._follow(socket)
            finally:
                self._watch_open = False

    async def _follow(self, socket: Any) -> None:
        import aiohttp

        async for message in socket:
            if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                break
            event = json.loads(message.data)
            with self._lock:
                pods = applied(self._pods, event)
                if pods is None:
                    return  # 410 Gone or an error: list again
                self._pods = pods
                # Seen (or gone): the watch answers for it from now on.
                uid = (event.get("object", {}).get("metadata") or {}).get("uid")
                self._own.pop(str(uid), None)

    @property
    def watching(self) -> bool:
        """Whether the watch on the job's pods is open now (the API server sends it every
        change from here on); False before it first opens and while it is listed again."""
        return self._watch_open

    # Launcher

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        """Create the container's pod; returns its UID.

        A pod of that name that already runs that container (a create whose
        answer was lost, say) is taken as it is; one that finished is deleted
        and made again; another's is refused (:class:`LaunchError`).
        """
        manifest = pod_manifest(
            job=self.job,
            container_id=container_id,
            image=self.image,
            command=self.command,
            env={**self.env, **env},
            grace_s=self.grace_s,
            owner=self._owner,
            template=self.template,
            service_account=self.service_account,
        )
        uid: str = self._call(self._create(manifest, container_id))
        with self._lock:
            if uid not in self._pods.by_uid:
                self._own[uid] = (container_id, time.monotonic())
        return uid

    async def _create(self, manifest: dict[str, Any], container_id: str) -> str:
        from kubernetes_asyncio import client

        core = client.CoreV1Api(self._api)
        name = manifest["metadata"]["name"]
        for _ in range(2):
            try:
                # The manifest as JSON, as sent: the client serializes a mapping as it is.
                pod = await core.create_namespaced_pod(
                    self.namespace,
                    manifest,  # type: ignore[arg-type]
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                return str(pod.metadata.uid)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise LaunchError(f"pod {name}: {_reason(exc)}") from None
            found = await core.read_namespaced_pod(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
            )
            view = PodView.of(self._api.sanitize_for_serialization(found))
            if is_live(view, container_id) and not view.deleting:
                return view.uid
            if view.container_id and view.container_id != container_id:
                raise LaunchError(
                    f"pod {name} exists in namespace {self.namespace} and runs container "
                    f"{view.container_id}, not {container_id}"
                )
            # That container's, finished: deleted (that one only) and made again.
            with contextlib.suppress(client.ApiException):
                await core.delete_namespaced_pod(
                    name,
                    self.namespace,
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=view.uid)),
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
        raise LaunchError(f"pod {name} exists in namespace {self.namespace} and is not deleted")

    def alive(self, handle: str, container_id: str) -> bool:
        """Whether the pod ``handle`` runs that container and may still run."""
        with self._lock:
            pod = self._pods.by_uid.get(handle)
            if pod is not None:
                return is_live(pod, container_id)
            own = self._own.get(handle)
            # Created after the last list began, and no event yet: it is pending.
            return own is not None and own[0] == container_id and own[1] >= self._listed_at

    def why(self, handle: str) -> str | None:
        """What Kubernetes says of the pod ``handle`` that is not running: ``pod Pending:
        ErrImagePull``, ``pod Failed: OOMKilled (exit code 137)``; None when it says nothing
        (the coordinator adds it to a failover's reason)."""
        with self._lock:
            pod = self._pods.by_uid.get(handle)
        if pod is None or not pod.reason:
            return None
        return f"pod {pod.phase}: {pod.reason}"

    def pod_of(self, handle: str) -> PodView | None:
        """What the watch last saw of the pod ``handle``."""
        with self._lock:
            return self._pods.by_uid.get(handle)

    def terminate(self, handle: str, container_id: str) -> None:
        """Delete the pod with its own grace period (SIGTERM, then SIGKILL at its end)."""
        self._delete(handle, container_id, None, "stopping")

    def kill(self, handle: str, container_id: str, sig: int) -> None:
        """Delete the pod with :data:`KILL_GRACE_S` (any ``sig``: a pod is only ever killed)."""
        self._delete(handle, container_id, KILL_GRACE_S, "killing")

    def _delete(self, handle: str, container_id: str, grace: int | None, what: str) -> None:
        with self._lock:
            pod = self._pods.by_uid.get(handle)
        name = pod.name if pod is not None else pod_name(container_id)
        if pod is not None and pod.container_id != container_id:
            return
        self._send(self._delete_pod(name, handle, grace), f"{what} pod {name}")

    async def _delete_pod(self, name: str, uid: str, grace: int | None) -> None:
        from kubernetes_asyncio import client

        # The UID as a precondition: a pod of that name made since is never deleted.
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid), grace_period_seconds=grace
        )
        await client.CoreV1Api(self._api).delete_namespaced_pod(
            name, self.namespace, body=body, _request_timeout=REQUEST_TIMEOUT_S
        )

    def reap(self) -> None:
        """Delete the job's succeeded pods and its failed ones but the newest few (each
        asked once per :data:`REQUEST_TIMEOUT_S`: reaping runs every tick, and the watch
        says a deleted pod is gone a moment later)."""
        now = time.monotonic()
        with self._lock:
            doomed = finished_to_delete(self._pods)
        self._reaped = {u: t for u, t in self._reaped.items() if now - t < REQUEST_TIMEOUT_S}
        for pod in doomed:
            if pod.uid in self._reaped:
                continue
            self._reaped[pod.uid] = now
            self._send(self._delete_pod(pod.name, pod.uid, 0), f"deleting finished pod {pod.name}")


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _reason(exc: BaseException) -> str:
    """An API error in one line: its status and the API server's message."""
    status = _status(exc)
    body = getattr(exc, "body", None) or getattr(exc, "reason", None)
    message = ""
    if isinstance(body, str | bytes):
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = str(body)
    message = (message or str(exc) or type(exc).__name__).splitlines()[0][:200]
    return f"HTTP {status}: {message}" if status else f"{type(exc).__name__}: {message}"


def load_template(path: str) -> dict[str, Any]:
    """A pod template file (YAML or JSON), checked to be a pod; one line if it is not."""
    import yaml  # type: ignore[import-untyped]  # kubernetes_asyncio's own dependency

    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as exc:
        raise ArgumentError.invalid(
            "--k8s-pod-template", "a readable YAML or JSON pod", f"{path} ({exc})"
        ) from None
    if not isinstance(loaded, dict) or loaded.get("kind", "Pod") != "Pod":
        raise ArgumentError.invalid("--k8s-pod-template", "a pod (kind: Pod)", path)
    return loaded
