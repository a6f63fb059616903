"""A Kubernetes API server for the specs, and a kubelet that runs its pods on this machine.

:func:`running_api_server` starts fabric8's ``kubernetes-server-mock`` in CRUD
mode (``make jars`` fetches it; ``java/io/github/sparkelastic/k8smock`` is
the main that serves it on a port) in a JVM of its own: a server that is not
ours, keeping the objects it is sent with UIDs and resource versions,
answering 404 and 409, label selectors, status patches and watches (over a
WebSocket). What it does not do, the specs do not rely on: it deletes a pod
at once whatever its grace period (no kubelet confirms), ignores deletion
preconditions, and runs no garbage collector (an owner reference is checked
as a field).

:class:`Kubelet` is the node: it runs each new pod of a namespace through
a launcher (:class:`LocalLauncher` processes, or :class:`NamespaceLauncher`
hosts of their own), so a pod runs for real, and reports its phase as a
kubelet does: ``Running`` once started, ``Succeeded`` or ``Failed`` when it
exits. A pod deleted from the API server is stopped (SIGTERM) and killed
after its grace period.

Lives in ``tests/`` beside :mod:`storage_jvm`; ``python tests/k8s_api.py``
runs a server for trying the project.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_jvm import JARS
from storage_jvm import JAVA_OPTIONS, StorageJvmError, _jars, _serving, java

K8S_JARS = JARS / "k8s-mock"
"""The mock server's classpath: maven/k8s-mock/pom.xml's dependencies and our main."""
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ApiServer:
    """A running API server: where clients reach it."""

    url: str
    pid: int

    def request(self, method: str, path: str, body: Any = None, patch: bool = False) -> Any:
        """One request (JSON in and out); an HTTP error is raised as it is.

        A GET, PATCH or DELETE the server leaves unanswered for 5 s is sent again (twice at
        most): fabric8's mock server, just after a watch's socket closed, now and then never
        answers a request (1 in 10-30 in a loop; every thread of its JVM idle, in jstack),
        and the same request sent again is answered at once. Only the stand-in kubelet's and
        the specs' own requests do this; the launcher's are its own.
        """
        data = None if body is None else json.dumps(body).encode()
        kind = "application/merge-patch+json" if patch else "application/json"
        attempts = 3 if method in ("GET", "PATCH", "DELETE") else 1
        for attempt in range(1, attempts + 1):
            request = urllib.request.Request(
                f"{self.url}{path}", data=data, method=method, headers={"Content-Type": kind}
            )
            try:
                with urllib.request.urlopen(request, timeout=5 if attempts > 1 else 10) as answer:
                    return json.loads(answer.read() or b"null")
            except TimeoutError:
                if attempt == attempts:
                    raise
                print(f"the mock API server left {method} {path} unanswered; sending it again")
        raise AssertionError("unreachable")

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return list(self.request("GET", f"/api/v1/namespaces/{namespace}/pods{query}")["items"])

    def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod))

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        """What a kubelet reports: the pod's phase."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        self.request("PATCH", path, {"status": {"phase": phase}}, patch=True)

    def delete_pod(self, namespace: str, name: str) -> None:
        """``kubectl delete pod NAME``."""
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/namespaces/default/pods", timeout=2):
            return True
    except OSError:
        return False


@contextmanager
def running_api_server(
    host: str = "127.0.0.1", timeout_s: float = START_TIMEOUT_S
) -> Iterator[ApiServer]:
    """The mock API server on a free port of ``host``; stopped by its PID at exit.

    Raises
    ------
    StorageJvmError
        No Java, no jars, or no server within ``timeout_s`` (one line naming its log).
    """
    jars = _jars(K8S_JARS, "Kubernetes mock server")
    workdir = Path(tempfile.mkdtemp(prefix="spark-elastic-k8s-"))
    port_file = workdir / "port"
    command = [
        java(),
        "-Xmx128m",
        *JAVA_OPTIONS,
        "-cp",
        ":".join(str(j) for j in jars),
        "io.github.sparkelastic.k8smock.ApiServer",
        host,
        "0",
        str(port_file),
    ]

    def ready() -> bool:
        return port_file.exists() and _answers(f"http://{host}:{port_file.read_text()}")

    try:
        with _serving("Kubernetes API server", command, workdir, ready, timeout_s) as (p, _):
            yield ApiServer(f"http://{host}:{port_file.read_text()}", p.pid)
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Kubelet:
    """Runs the containers' pods of ``namespace`` through ``launcher`` (see the module's
    docstring); other pods (the coordinator's own) it leaves alone.

    ``runs`` maps a pod's command to the one the launcher runs (a spec's
    stand-in container for ``spark-elastic container run``, say); the pod's
    environment is the process's, on top of the launcher's own.
    """

    api: ApiServer
    namespace: str
    launcher: Any
    runs: Callable[[Sequence[str]], Sequence[str]] = lambda command: command
    pulls: Callable[[str], str | None] = lambda image: None
    """An image's pull failure (``ErrImagePull``), or None: it pulls."""
    poll_s: float = 0.1
    started: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Pod UID -> (container id, the launcher's handle), of every pod it ran."""
    commands: dict[str, list[str]] = field(default_factory=dict)
    """Pod UID -> the command its pod asked for."""
    _ended: set[str] = field(default_factory=set)
    _grace: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)

    def __enter__(self) -> Kubelet:
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for uid, (container_id, handle) in self.started.items():
            if uid not in self._ended:
                self.launcher.kill(handle, container_id, 9)
        with contextlib.suppress(Exception):
            self.launcher.reap()

    def _run(self) -> None:
        doomed: dict[str, float] = {}
        while not self._stop.wait(self.poll_s):
            try:
                pods = {p["metadata"]["uid"]: p for p in self.api.pods(self.namespace)}
            except OSError as exc:
                self.errors.append(str(exc))
                continue
            for uid, pod in pods.items():
                if "spark-elastic/job" not in (pod["metadata"].get("labels") or {}):
                    continue  # not a container's (the coordinator's own pod runs elsewhere)
                if uid not in self.started and uid not in self._ended:
                    self._start(uid, pod)
                elif uid in self.started and uid not in self._ended:
                    container_id, handle = self.started[uid]
                    if not self.launcher.alive(handle, container_id):
                        self._ended.add(uid)
                        with contextlib.suppress(OSError):
                            self.api.set_phase(self.namespace, pod["metadata"]["name"], "Failed")
            # Deleted pods: stopped now, killed after their grace.
            for uid, (container_id, handle) in self.started.items():
                if uid in pods or uid in self._ended:
                    continue
                if uid not in doomed:
                    grace = self._grace.get(uid, 30)
                    doomed[uid] = time.monotonic() + grace
                    self.launcher.terminate(handle, container_id)
                elif not self.launcher.alive(handle, container_id):
                    self._ended.add(uid)
                elif time.monotonic() > doomed[uid]:
                    self.launcher.kill(handle, container_id, 9)
            self.launcher.reap()

    def _value(self, item: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
        """An environment variable's value, the downward API's as a kubelet resolves it: the
        pod's address is this machine's loopback (a namespace launcher sets its own)."""
        field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if field == "status.podIP":
            return "127.0.0.1"
        if field == "metadata.name":
            return str(pod["metadata"]["name"])
        return str(item.get("value", ""))

    def set_waiting(self, name: str, reason: str) -> None:
        """What a kubelet reports of a pod whose container cannot start."""
        waiting = {"name": "container", "state": {"waiting": {"reason": reason}}}
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}/status"
        status = {"status": {"phase": "Pending", "containerStatuses": [waiting]}}
        self.api.request("PATCH", path, status, patch=True)

    def _start(self, uid: str, pod: Mapping[str, Any]) -> None:
        spec = pod["spec"]
        main = spec["containers"][0]
        failed = self.pulls(main["image"])
        if failed is not None:  # it never runs: pending, saying why
            self._ended.add(uid)
            with contextlib.suppress(OSError):
                self.set_waiting(pod["metadata"]["name"], failed)
            return
        env = {e["name"]: self._value(e, pod) for e in main.get("env") or ()}
        container_id = pod["metadata"]["annotations"]["spark-elastic/container-id"]
        self.commands[uid] = list(main["command"])
        self._grace[uid] = float(spec.get("terminationGracePeriodSeconds", 30))
        self.launcher.command = tuple(self.runs(main["command"]))
        try:
            handle = self.launcher.launch(container_id, env)
        except Exception as exc:  # a pod that cannot start fails, as on a node
            self.errors.append(f"{pod['metadata']['name']}: {exc}")
            self._ended.add(uid)
            with contextlib.suppress(OSError):
                self.api.set_phase(self.namespace, pod["metadata"]["name"], "Failed")
            return
        self.started[uid] = (container_id, handle)
        with contextlib.suppress(OSError):
            self.api.set_phase(self.namespace, pod["metadata"]["name"], "Running")


def main() -> None:
    parser = argparse.ArgumentParser(description="A Kubernetes API server (fabric8's mock).")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    with running_api_server(args.host) as server:
        print(f"Kubernetes API server: {server.url} (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    try:
        main()
    except StorageJvmError as exc:
        raise SystemExit(str(exc)) from None
