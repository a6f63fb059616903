"""``spark-elastic job run`` and ``job status``: a job's coordinator, in the foreground.

``job run JOB --containers N`` loads the job (``file.py:attribute`` or
``module:attribute``), plans it, opens (or resumes) its store, listens on
loopback, prints ``status: URL`` on stdout, launches the containers, and runs
until SIGINT or SIGTERM, which stop the containers, then the coordinator.
``job status URL`` prints the coordinator's view (``--json`` for all of it).
``job scale URL --containers N`` changes a running job's container count, and
``job scale URL --elasticity-factor F`` its factor (split or merge, live);
``job scale URL --cancel`` rolls the change in flight back while it can be.
``job run`` of a stopped (or failed) job resumes it; a second ``job run`` of a
job whose coordinator runs is refused in one line naming that coordinator;
``job autoscale URL --on|--off|--pin N|--min A --max B`` sets its autoscaler.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_elastic.errors import ArgumentError
from spark_elastic.runtime.coordinator.history import WINDOWS_S, summary_lines

if TYPE_CHECKING:
    from spark_elastic.runtime.coordinator.autoscaler import AutoscalerConfig
    from spark_elastic.runtime.coordinator.input_process import InputProcess
    from spark_elastic.runtime.coordinator.launchers import Launcher
    from spark_elastic.runtime.inputs import JobInput
    from spark_elastic.runtime.job import Job

__all__ = ["register"]


def _positive_ms(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of milliseconds, found {text!r}"
        )
    return int(text)


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {text!r}")
    return int(text)


def _factor(text: str) -> int:
    from spark_elastic.model.names import MAX_ELASTICITY_FACTOR, is_power_of_two

    if not (text.isascii() and text.isdigit()) or not (
        is_power_of_two(int(text)) and int(text) <= MAX_ELASTICITY_FACTOR
    ):
        raise argparse.ArgumentTypeError(
            f"expected a power of two from 1 to {MAX_ELASTICITY_FACTOR}, found {text!r}"
        )
    return int(text)


def _zero_or_more(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, found {text!r}")
    return int(text)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, found {text!r}")
    return int(text)


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or "," in text:
        raise argparse.ArgumentTypeError(f"expected a coordinator's http:// URL, found {text!r}")
    return text.rstrip("/")


def _bridge(text: str) -> tuple[str, str]:
    name, sep, network = text.partition("=")
    if not sep or not name or not network:
        raise argparse.ArgumentTypeError(
            f"expected NAME=CIDR like se0=10.77.0.0/24, found {text!r}"
        )
    return name, network


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, found {text!r}")
    return key, value


def register(subparsers: Any) -> None:
    """Add ``job run`` and ``job status`` to the CLI."""
    parser = subparsers.add_parser(
        "job",
        help="run a job as containers under a coordinator, or query one",
        description="Run a job as containers under a coordinator, or query a running one.",
    )
    commands = parser.add_subparsers(dest="job_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="the coordinator in the foreground, launching N local containers",
        description="Run JOB's coordinator in the foreground; it launches the containers. "
        "SIGINT or SIGTERM stops everything.",
    )
    run.add_argument("job", metavar="JOB", help="file.py:attribute or module:attribute")
    run.add_argument(
        "--containers",
        type=_count,
        default=1,
        metavar="N",
        help="containers of a new job (default: 1); a resumed job keeps its own",
    )
    run.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    run.add_argument("--port", type=_port, default=8470, help="port (default: 8470; 0: any free)")
    run.add_argument("--token", help="shared bearer token (required off loopback)")
    run.add_argument(
        "--store",
        metavar="PATH|URL",
        help="the coordinator's store: a SQLite file (default: <checkpoint root>/coordinator.db; "
        "required for a root on HDFS or S3) or postgresql://user:password@host:port/database, "
        "which coordinators on other hosts can share",
    )
    run.add_argument(
        "--store-lease-ms",
        type=_positive_ms,
        default=20_000,
        help="how long a PostgreSQL store's leader holds it without renewing (20000); at least "
        "--lease-ms plus --margin-ms, so the leader can grant whole container leases",
    )
    run.add_argument(
        "--peer",
        action="append",
        default=[],
        type=_http_url,
        metavar="URL",
        help="another coordinator of the job (a standby on another host; repeatable): its "
        "containers turn to it when this one does not answer",
    )
    run.add_argument(
        "--logs",
        metavar="DIR",
        help="where the containers' logs go (default: <checkpoint root>/logs, or beside a "
        "SQLite store; required when neither is on the local disk)",
    )
    run.add_argument(
        "--advertise",
        type=_http_url,
        metavar="URL",
        help="the URL containers and peers reach this coordinator at (default: http://HOST:PORT "
        "of --host and --port); on Kubernetes, its Service's or its pod's",
    )
    run.add_argument(
        "--launcher",
        choices=("local", "namespaces", "kubernetes"),
        default="local",
        help="where containers run: local processes (the default), each a host of its own "
        "on this machine (Linux namespaces on a bridge; root; for trying a job across hosts), "
        "or each a Kubernetes pod (docs/deployment.md)",
    )
    k8s = run.add_argument_group("--launcher kubernetes")
    k8s.add_argument("--k8s-image", metavar="IMAGE", help="the containers' image (required)")
    k8s.add_argument(
        "--k8s-namespace",
        metavar="NS",
        help="the pods' namespace (default: the coordinator pod's own, else 'default')",
    )
    k8s.add_argument(
        "--k8s-server",
        type=_http_url,
        metavar="URL",
        help="the API server (default: in a pod, its service account's; else the kubeconfig)",
    )
    k8s.add_argument(
        "--k8s-owner-pod",
        metavar="NAME",
        default=os.environ.get("POD_NAME"),
        help="the coordinator's own pod, owner of the containers' pods (default: $POD_NAME)",
    )
    k8s.add_argument(
        "--k8s-pod-template",
        metavar="FILE",
        help="a pod (YAML or JSON) the containers' pods start from: resources, volumes...",
    )
    k8s.add_argument(
        "--k8s-service-account",
        metavar="NAME",
        help="the containers' service account (a k8s:// --master needs one that makes pods)",
    )
    run.add_argument(
        "--bridge",
        type=_bridge,
        default=("se0", "10.77.0.0/24"),
        metavar="NAME=CIDR",
        help="--launcher namespaces: the bridge the containers join, made if missing "
        "(se0=10.77.0.0/24); the coordinator listens on one of its addresses (--host): its "
        "first, or another (a standby's; no container is given it) that it adds to the "
        "bridge, or that is its own in a network namespace with a link on the bridge",
    )
    run.add_argument(
        "--hide",
        action="append",
        default=[],
        metavar="DIR",
        help="--launcher namespaces: a directory not mounted in the containers (repeatable)",
    )
    run.add_argument("--master", help="Spark master URL for the containers (default: local[2])")
    run.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for every container (repeatable)",
    )
    run.add_argument("--lease-ms", type=_positive_ms, default=10_000, help="lease length (10000)")
    run.add_argument(
        "--margin-ms",
        type=_positive_ms,
        default=5_000,
        help="wait after a lease expires before its tasks move (5000)",
    )
    run.add_argument(
        "--write-budget-ms",
        type=_positive_ms,
        default=3_000,
        help="lease a container must have left to start a write (3000)",
    )
    run.add_argument(
        "--heartbeat-ms",
        type=_positive_ms,
        default=1_000,
        help="container heartbeat interval (1000)",
    )
    run.add_argument(
        "--heartbeat-timeout-ms",
        type=_positive_ms,
        help="time limit of one heartbeat request (twice the interval, within 1000-5000)",
    )
    run.add_argument(
        "--heartbeat-retries",
        type=_count,
        default=6,
        help="failed heartbeats in a row before a container gives up (6, as Samza)",
    )
    run.add_argument(
        "--partition-check-ms",
        type=_count,
        default=300_000,
        help="how often the inputs' partition counts are checked for growth "
        "(300000, Samza's default; SEP-5)",
    )
    run.add_argument(
        "--cold-moves",
        action="store_true",
        help="move stateful tasks without warm-ups: a new owner starts only once its old "
        "owners stopped (for comparison; KIP-441's warm-ups are the default)",
    )
    run.add_argument(
        "--warm-up-mode",
        choices=("replay", "snapshot"),
        default="replay",
        help="how a stateful warm-up follows its old owners: replay (the default where the "
        "input allows it, the embedded log: it runs the job's query on a snapshot of their "
        "state and applies their committed records without output, so it takes the tasks "
        "over without restarting) or snapshot (it renews a copy of their state and starts "
        "its query at the handover)",
    )
    run.add_argument(
        "--catch-up-ms",
        type=_positive_ms,
        default=60_000,
        help="how long a move's old owners keep running, once listed as stopping, for their "
        "replaying warm-ups to catch up with them before they stop anyway (60000)",
    )
    run.add_argument(
        "--startup-ms",
        type=_positive_ms,
        default=180_000,
        help="how long a container may take to register, from its launch (180000)",
    )
    run.add_argument(
        "--warm-up-deadline-ms",
        type=_positive_ms,
        default=600_000,
        help="how long a move's warm-ups may take to be ready: past it the move is rolled "
        "back (the old owners keep their tasks), or, once one of its groups moved, its "
        "warm-ups start again (600000)",
    )
    run.add_argument(
        "--max-start-failures",
        type=_count,
        default=5,
        metavar="N",
        help="failures in a row, of one cause, before a container's first commit after which "
        "the job stops as failed, saying why (5); relaunches back off 1, 2, 4... 60 s",
    )
    scaler = run.add_argument_group(
        "autoscaler",
        "Scale a job's containers (and, with --autoscale-max-factor, its elasticity factor) on "
        "lag and processing rate (off by default). A resumed job keeps the store's settings "
        "unless one of these is given.",
    )
    scaler.add_argument("--autoscale", action="store_true", help="turn the autoscaler on")
    scaler.add_argument("--autoscale-min", type=_count, metavar="N", help="fewest containers (1)")
    scaler.add_argument(
        "--autoscale-max", type=_count, metavar="N", help="most containers (the task count)"
    )
    scaler.add_argument(
        "--autoscale-drain-ms",
        type=_positive_ms,
        metavar="MS",
        help="scale out when the backlog would take longer to drain (60000)",
    )
    scaler.add_argument(
        "--autoscale-window-ms",
        type=_zero_or_more,
        metavar="MS",
        help="how long a wish must hold before it acts (60000)",
    )
    scaler.add_argument(
        "--autoscale-cooldown-ms",
        type=_zero_or_more,
        metavar="MS",
        help="no action this long after a change of the container count (120000)",
    )
    scaler.add_argument(
        "--autoscale-busy-lag",
        type=_zero_or_more,
        metavar="RECORDS",
        help="a task with more lag is busy: no scale-in meanwhile (1000)",
    )
    scaler.add_argument(
        "--autoscale-max-factor",
        type=_factor,
        metavar="F",
        help="split up to this elasticity factor when more containers than tasks are needed, "
        "and merge back to the job's own once there is room (default: never change the factor)",
    )
    run.set_defaults(run=_run)
    status = commands.add_parser(
        "status",
        help="print a running coordinator's view",
        description="Print a running coordinator's view of its job.",
    )
    status.add_argument(
        "url", metavar="URL", help="the coordinator's URL, e.g. http://127.0.0.1:8470"
    )
    status.add_argument("--json", action="store_true", help="everything, as JSON")
    status.add_argument(
        "--history",
        type=int,
        choices=WINDOWS_S,
        metavar="SECONDS",
        help="also the last SECONDS (300 or 1800) of rates, lag, batch times and changes "
        "(with --json: as the status page charts them)",
    )
    status.add_argument("--token", help="bearer token, if the coordinator requires one")
    status.set_defaults(run=_status)
    scale = commands.add_parser(
        "scale",
        help="change how many containers run a job, or its elasticity factor",
        description="Change how many containers run a running job (KIP-441's assignor plans "
        "the moves; containers whose tasks stay keep running), or its elasticity factor "
        "(split or merge its virtual tasks, one container at a time).",
    )
    scale.add_argument("url", metavar="URL", help="the coordinator's URL")
    change = scale.add_mutually_exclusive_group(required=True)
    change.add_argument("--containers", type=_count, help="the new container count")
    change.add_argument(
        "--elasticity-factor", type=_factor, metavar="F", help="the new elasticity factor"
    )
    change.add_argument(
        "--cancel",
        action="store_true",
        help="roll back the change in flight: its warm-ups stop, the old owners keep their "
        "tasks (refused once the change can no longer be rolled back)",
    )
    scale.add_argument("--token", help="bearer token, if the coordinator requires one")
    scale.set_defaults(run=_scale)
    autoscale = commands.add_parser(
        "autoscale",
        help="turn a running job's autoscaler on or off, pin it, or change its bounds",
        description="Set a running job's autoscaler: on or off, pinned at N containers (held "
        "there whatever the load), and its bounds.",
    )
    autoscale.add_argument("url", metavar="URL", help="the coordinator's URL")
    mode = autoscale.add_mutually_exclusive_group()
    mode.add_argument("--on", action="store_true", help="scale on load")
    mode.add_argument("--off", action="store_true", help="do not scale (and unpin)")
    mode.add_argument("--pin", type=_count, metavar="N", help="hold the job at N containers")
    autoscale.add_argument("--min", type=_count, metavar="A", help="fewest containers")
    autoscale.add_argument("--max", type=_count, metavar="B", help="most containers")
    autoscale.add_argument(
        "--max-factor", type=_factor, metavar="F", help="highest elasticity factor to split to"
    )
    autoscale.add_argument("--token", help="bearer token, if the coordinator requires one")
    autoscale.set_defaults(run=_autoscale)


class _InputWatch:
    """The job's input as the coordinator's partition monitor sees it."""

    def __init__(self, job_input: JobInput) -> None:
        self.input = job_input

    def partition_counts(self) -> Mapping[str, int]:
        return self.input.partition_counts()

    def end_offsets(self, topic: str) -> Mapping[int, int]:
        return self.input.end_offsets(topic)

    @property
    def group_view(self) -> bool:
        return hasattr(self.input, "commit_group_offsets")

    def commit_group_offsets(self, group: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        self.input.commit_group_offsets(group, offsets)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Nothing to stop: the input is read in this process."""


def _run(args: argparse.Namespace) -> int:
    from spark_elastic.runtime.coordinator.stores import is_networked
    from spark_elastic.runtime.job import load_job

    job = load_job(args.job)
    if "://" in job.checkpoint_root and not args.store:
        raise ArgumentError.invalid(
            "--store",
            "the coordinator's store (a local SQLite path, or a postgresql:// URL) when the "
            "checkpoint root is not on the local disk",
            f"none, checkpoint root {job.checkpoint_root}",
        )
    if "://" in job.checkpoint_root and args.store and is_networked(args.store) and not args.logs:
        raise ArgumentError.invalid(
            "--logs",
            "a local directory for the containers' logs when neither the checkpoint root nor "
            "the store is on the local disk",
            None,
        )
    watch = _watch(job.input)
    try:
        return _run_job(args, job, watch)
    finally:
        watch.close()


def _watch(job_input: JobInput) -> _InputWatch | InputProcess:
    """The coordinator's view of the input. A Kafka input's calls go through librdkafka,
    whose aborts (a broker restarting under a group commit) would take the coordinator
    down: they run in a child process it restarts (:mod:`.coordinator.input_process`)."""
    from spark_elastic.runtime.coordinator.input_process import InputProcess
    from spark_elastic.runtime.inputs import KafkaInput

    return InputProcess(job_input) if isinstance(job_input, KafkaInput) else _InputWatch(job_input)


def _run_job(args: argparse.Namespace, job: Job, watch: _InputWatch | InputProcess) -> int:
    from spark_elastic.runtime.coordinator.server import (
        CoordinatorServer,
        bind,
        is_loopback,
        url_of,
    )
    from spark_elastic.runtime.coordinator.standby import lead_or_stand_by
    from spark_elastic.runtime.coordinator.stores import is_networked, open_store, refuse_if_owned
    from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
    from spark_elastic.runtime.lease import LeaseTerms

    partitions = watch.partition_counts()
    plan = job.plan(partitions)
    _check_lease_options(args)
    if args.host in ("0.0.0.0", "::") and not args.advertise:
        # Every address: none of them says which one the containers can reach.
        raise ArgumentError.invalid(
            "--advertise",
            f"the URL containers reach this coordinator at, with --host {args.host}",
            None,
        )
    terms = LeaseTerms(
        lease_s=args.lease_ms / 1000,
        margin_s=args.margin_ms / 1000,
        write_budget_s=args.write_budget_ms / 1000,
    )
    root = job.checkpoint_root  # a local path, or a URI (HDFS, S3): not a Path
    shape = JobShape(
        job.name,
        args.job,
        job.elasticity_factor,
        partitions,
        tuple(plan.task_names()),
        root,
        job.grouper,
        stateful=job.processor is not None,
        time_ordered=job.time_ordered,
    )
    autoscaler = _autoscaler_options(args, len(shape.tasks))
    container_env = {
        "SPARK_ELASTIC_HEARTBEAT_MS": str(args.heartbeat_ms),
        "SPARK_ELASTIC_HEARTBEAT_RETRIES": str(args.heartbeat_retries),
        "SPARK_ELASTIC_WRITE_BUDGET_MS": str(args.write_budget_ms),
        "SPARK_ELASTIC_CONF": json.dumps(dict(args.conf)),
        "SPARK_ELASTIC_WARMUP": args.warm_up_mode,
    }
    if args.heartbeat_timeout_ms:
        container_env["SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS"] = str(args.heartbeat_timeout_ms)
    if args.master:
        container_env["SPARK_ELASTIC_MASTER"] = args.master
    if args.token:
        container_env["SPARK_ELASTIC_TOKEN"] = args.token
    if args.peer:
        container_env["SPARK_ELASTIC_COORDINATORS"] = ",".join(args.peer)
    if is_loopback(args.host) and "SPARK_LOCAL_IP" not in os.environ:
        # Spark's drivers bind the machine's external address by default: a job whose
        # coordinator listens on loopback keeps its containers there too.
        container_env["SPARK_LOCAL_IP"] = "127.0.0.1"
    location = args.store or str(Path(root) / "coordinator.db")
    store_lease_s = args.store_lease_ms / 1000
    if not is_networked(location):
        # One coordinator per job: refused before it binds a port or touches anything.
        refuse_if_owned(location, store_lease_s)
    if args.logs:
        logs = Path(args.logs)
    elif "://" not in root:
        logs = Path(root) / "logs"
    else:
        logs = Path(location).parent / "logs"
    launcher = _launcher(args, logs, job.name)  # refused before anything binds or is written
    sock = bind(args.host, args.port)
    try:
        store = open_store(location, store_lease_s)
    except BaseException:
        sock.close()
        raise
    stored_job = store.meta("job")
    if stored_job is not None and stored_job != job.name:
        # Refused before this coordinator claims (writes) anything in another job's store.
        sock.close()
        store.close()
        raise ArgumentError.invalid(
            "--store",
            f"the store of job {job.name!r}, or an empty one",
            f"the store of job {stored_job!r} at {store.location}",
        )
    if is_networked(location):
        # A shared store another coordinator leads: this one stands by until it may lead.
        url = args.advertise or url_of(sock)

        def standing_by(leader: str | None) -> None:
            print(f"standby: {url}/ (the job is led by {leader or 'an unnamed coordinator'})")
            sys.stdout.flush()

        try:
            declined = lead_or_stand_by(store, url, sock, standing_by)
        except BaseException:
            sock.close()
            store.close()
            raise
        if declined:
            print(declined)
            sock.close()
            store.close()
            return 0

    def make(url: str) -> Supervisor:
        return Supervisor(
            shape,
            store,
            launcher,
            url,
            args.containers,
            terms,
            startup_s=args.startup_ms / 1000,
            container_env=container_env,
            watch=watch,
            partition_check_s=args.partition_check_ms / 1000,
            autoscaler=autoscaler,
            warm_ups=not args.cold_moves,
            catch_up_s=args.catch_up_ms / 1000,
            warm_up_deadline_s=args.warm_up_deadline_ms / 1000,
            max_start_failures=args.max_start_failures,
        )

    try:
        server = CoordinatorServer(make, sock, args.token, args.advertise)
    except BaseException:
        sock.close()
        store.close()
        raise

    def ready() -> None:
        print(f"status: {server.url}/", flush=True)

    return server.run_forever(ready)


_AUTOSCALE_OPTIONS = {
    # JSON key -> (option, scale from the option's unit to the setting's)
    "minContainers": ("--autoscale-min", 1),
    "maxContainers": ("--autoscale-max", 1),
    "maxDrainS": ("--autoscale-drain-ms", 1000),
    "windowS": ("--autoscale-window-ms", 1000),
    "cooldownS": ("--autoscale-cooldown-ms", 1000),
    "busyLag": ("--autoscale-busy-lag", 1),
    "maxElasticityFactor": ("--autoscale-max-factor", 1),
}


def _autoscaler_options(args: argparse.Namespace, task_count: int) -> AutoscalerConfig | None:
    """The autoscaler's settings from ``job run``'s options; None when none was given."""
    from spark_elastic.runtime.coordinator.autoscaler import AutoscalerConfig

    given = {
        key: value if unit == 1 else value / unit
        for key, (option, unit) in _AUTOSCALE_OPTIONS.items()
        if (value := getattr(args, option[2:].replace("-", "_"))) is not None
    }
    if not given and not args.autoscale:
        return None
    names = {key: option for key, (option, _) in _AUTOSCALE_OPTIONS.items()}
    return AutoscalerConfig().updated(
        {**given, "enabled": args.autoscale}, task_count=task_count, names=names
    )


def _launcher(args: argparse.Namespace, logs: Path, job_name: str) -> Launcher:
    """The launcher ``job run`` asked for: local processes, namespaces on a bridge, or pods."""
    from spark_elastic.runtime.coordinator.launchers import LocalLauncher

    if args.launcher == "local":
        return LocalLauncher(logs)
    if args.launcher == "kubernetes":
        return _kubernetes_launcher(args, job_name)
    from spark_elastic.runtime.coordinator.launchers.namespaces import (
        Bridge,
        NamespaceError,
        NamespaceLauncher,
    )

    if os.geteuid() != 0:
        raise ArgumentError.invalid("--launcher", "root for namespaces", f"uid {os.geteuid()}")
    name, network = args.bridge
    try:
        net = ipaddress.IPv4Network(network)
    except ValueError:
        raise ArgumentError.invalid(
            "--bridge", "NAME=CIDR like se0=10.77.0.0/24", network
        ) from None
    gateway = str(net.network_address + 1)
    try:
        host = ipaddress.IPv4Address(args.host)
    except ValueError:
        host = None
    if host is None or host not in net or host in (net.network_address, net.broadcast_address):
        raise ArgumentError.invalid(
            "--host",
            f"an address of the bridge's network {net} with --launcher namespaces (containers "
            f"reach the coordinator over it): its own, {gateway}, or, for a standby, another "
            f"such as {net.broadcast_address - 1}",
            args.host,
        )
    # The coordinators' addresses (its own, its peers') are never given to a container.
    peers = [urllib.parse.urlsplit(p).hostname or "" for p in args.peer]
    reserved = tuple(a for a in (args.host, *peers) if _in_network(a, net))
    try:
        bridge = Bridge.create(name, network)
        launcher = NamespaceLauncher(
            bridge,
            logs,
            prefix=name[:8],
            hidden=tuple(Path(d) for d in args.hide),
            reserved=reserved,
        )
        if args.host != gateway:
            if any(launcher.address_of(h) == args.host for h in launcher.namespaces()):
                raise ArgumentError.invalid(
                    "--host", "an address of the bridge no container holds", args.host
                )
            if bridge.netns is None:
                bridge.add_address(args.host)
            # Else a coordinator on a host of its own (a network namespace with a link on
            # the bridge): the address is its own interface's.
    except NamespaceError as exc:
        raise ArgumentError.invalid("--bridge", "a bridge this host can make", str(exc)) from None
    return launcher


def _in_network(address: str, net: ipaddress.IPv4Network) -> bool:
    try:
        return ipaddress.IPv4Address(address) in net
    except ValueError:
        return False


IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _kubernetes_launcher(args: argparse.Namespace, job_name: str) -> Launcher:
    """Pods through the API server; refused in one line before anything binds or is written."""
    from spark_elastic.runtime.coordinator.launchers import LaunchError
    from spark_elastic.runtime.coordinator.launchers.kubernetes import (
        KubernetesLauncher,
        load_template,
    )

    if not args.k8s_image:
        raise ArgumentError.invalid("--k8s-image", "the containers' image", None)
    namespace = args.k8s_namespace
    if namespace is None:
        try:
            namespace = Path(IN_CLUSTER_NAMESPACE).read_text().strip() or "default"
        except OSError:
            namespace = "default"
    template = load_template(args.k8s_pod_template) if args.k8s_pod_template else None
    launcher = KubernetesLauncher(
        namespace,
        args.k8s_image,
        job_name,
        # Longer than a lease and its margin: the coordinator kills on its own schedule.
        grace_s=(args.lease_ms + args.margin_ms) / 1000 + 5,
        server=args.k8s_server,
        owner_pod=args.k8s_owner_pod,
        template=template,
        service_account=args.k8s_service_account,
    )
    try:
        return launcher.start()
    except LaunchError as exc:
        raise ArgumentError(str(exc)) from None


def _check_lease_options(args: argparse.Namespace) -> None:
    """The lease rules of :class:`LeaseTerms`, told in the options' own names."""
    if args.write_budget_ms >= args.lease_ms:
        raise ArgumentError.invalid(
            "--write-budget-ms", f"below --lease-ms ({args.lease_ms})", args.write_budget_ms
        )
    if args.margin_ms < args.write_budget_ms:
        raise ArgumentError.invalid(
            "--margin-ms",
            f"at least --write-budget-ms ({args.write_budget_ms}), so a write begun in time ends "
            "before its tasks move",
            args.margin_ms,
        )
    if args.heartbeat_ms * 2 > args.lease_ms:
        raise ArgumentError.invalid(
            "--heartbeat-ms", f"at most half the lease ({args.lease_ms // 2} ms)", args.heartbeat_ms
        )
    if args.store_lease_ms < args.lease_ms + args.margin_ms:
        raise ArgumentError.invalid(
            "--store-lease-ms",
            f"at least --lease-ms plus --margin-ms ({args.lease_ms + args.margin_ms}), so the "
            "leader can grant whole container leases",
            args.store_lease_ms,
        )


def _call(url_arg: str, path: str, token: str | None, body: Any = None) -> Any:
    """One request to a coordinator; every failure is one line naming URL."""
    url = url_arg.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ArgumentError.invalid("URL", "the coordinator's http:// URL", url_arg)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            raise ArgumentError.invalid(
                "URL", "a spark-elastic coordinator", f"{url} (HTTP {exc.code})"
            ) from None
        raise ArgumentError(f"{url}{path}: {message}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ArgumentError.invalid(
            "URL", "a running spark-elastic coordinator", f"{url} ({reason})"
        ) from None


def _scale(args: argparse.Namespace) -> int:
    body: dict[str, Any]
    if args.cancel:
        body = {"cancel": True}
    elif args.containers is not None:
        body = {"containers": args.containers}
    else:
        body = {"elasticityFactor": args.elasticity_factor}
    reply = _call(args.url, "/scale", args.token, body)
    print(reply["summary"])
    return 0


def _autoscale(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.on or args.off:
        body["enabled"] = bool(args.on)
    if args.pin is not None:
        body["pinned"] = args.pin
    if args.min is not None:
        body["minContainers"] = args.min
    if args.max is not None:
        body["maxContainers"] = args.max
    if args.max_factor is not None:
        body["maxElasticityFactor"] = args.max_factor
    if not body:
        raise ArgumentError.invalid(
            "job autoscale", "one of --on, --off, --pin N, --min A, --max B, --max-factor F", "none"
        )
    reply = _call(args.url, "/autoscaler", args.token, body)
    print(f"autoscaler {reply['summary']}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from spark_elastic.runtime.coordinator.status import coordinator_line

    status = _call(args.url, "/status.json", args.token)
    history = None
    if args.history is not None:
        history = _call(args.url, f"/history.json?window={args.history}", args.token)
    if args.json:
        shown = status | {"history": history} if history else status
        print(json.dumps(shown, indent=2, sort_keys=True))
        return 0
    state = status["jobState"]
    print(
        f"job {status['job']} {state['state']}: job model {status['jobModelVersion']}, "
        f"factor {status['elasticityFactor']}, partitions {status['partitions']}"
    )
    if state["state"] != "running" and state["why"]:
        print(f"  why: {state['why']}")
    print(f"  {coordinator_line(status['coordinator'])}")
    change = status["change"]
    if change is not None:
        cancel = "; can be cancelled (--cancel)" if change["cancellable"] else ""
        print(
            f"  change: {change['description']}, {change['inPhaseS']:.0f} s in this phase{cancel}"
        )
    ended: dict[str, int] = {}
    for c in status["containers"]:
        if c["state"] in ("launching", "warm", "running"):
            lease = (
                f"lease {c['leaseLeftS']} s"
                if c["leaseLeftS"] is not None
                else f"starting ({c.get('startupLeftS') or '-'} s left to register)"
            )
            print(
                f"  {c['containerId']:<16} {c['state']:<9} pid {c['pid'] or '-':<7} "
                f"generation {c['generation']:<4} {len(c['tasks'])} tasks, "
                f"{lease}, last batch {c['lastBatch']}"
            )
        else:
            ended[c["state"]] = ended.get(c["state"], 0) + 1
            if c.get("cause"):
                print(f"  {c['containerId']:<16} {c['state']:<9} failed: {c['cause']}")
    if ended:
        print("  ended: " + ", ".join(f"{n} {s}" for s, n in sorted(ended.items())))
    lag = status["inputLag"]
    print(f"  input lag: {'unknown' if lag is None else f'{lag} records'}")
    health = status["input"]
    if health["state"] == "failing":
        print(f"  input failing for {health['failingForS']:.0f} s:")
        for call, detail in health["failing"].items():
            print(f"    {call}: {detail}")
    if health["clientRestarts"]:
        print(
            f"  input client process started again {health['clientRestarts']} times "
            f"(last: {health['clientLastDeath']})"
        )
    if status.get("recordsEnforced") is not None:
        print(f"  records processed without waiting (enforced): {status['recordsEnforced']}")
    for line in summary_lines(history) if history else ():
        print(f"  {line}")
    sys.stdout.flush()
    return 0
