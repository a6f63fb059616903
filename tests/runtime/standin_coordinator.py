"""A coordinator in a process of its own, on a shared store, launching stand-in containers.

``job run``'s way to lead or stand by (:func:`lead_or_stand_by`, then a
:class:`CoordinatorServer` on the same socket), with ``standins``' job and
stand-in containers instead of Spark drivers, so that a spec can SIGKILL a
leading coordinator and watch its standby take the job over::

    standin_coordinator.py STORE_URL ROOT PORT [PEER_URL ...]

It prints ``standby: URL/ ...`` while it stands by and ``status: URL/`` once it
leads. ``STANDIN_STORE_LEASE_S`` sets the store's lease (3 s).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from standins import HERE, TERMS, shape

from spark_elastic.runtime.coordinator.launchers import LocalLauncher
from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind, url_of
from spark_elastic.runtime.coordinator.standby import lead_or_stand_by
from spark_elastic.runtime.coordinator.stores import open_store
from spark_elastic.runtime.coordinator.supervisor import Supervisor
from spark_elastic.runtime.protocol import COORDINATORS_ENV


def main(argv: list[str]) -> int:
    location, root, port, peers = argv[0], Path(argv[1]), int(argv[2]), argv[3:]
    store = open_store(location, float(os.environ.get("STANDIN_STORE_LEASE_S", "3")))
    sock = bind("127.0.0.1", port)
    url = url_of(sock)
    declined = lead_or_stand_by(
        store, url, sock, lambda leader: print(f"standby: {url}/ (led by {leader})", flush=True)
    )
    if declined:
        print(declined, flush=True)
        return 0
    launcher = LocalLauncher(root / "logs", [sys.executable, str(HERE / "standin_container.py")])
    server = CoordinatorServer(
        lambda url: Supervisor(
            shape(root),
            store,
            launcher,
            url,
            2,
            TERMS,
            startup_s=20,
            container_env={"SPARK_ELASTIC_HEARTBEAT_MS": "200", COORDINATORS_ENV: ",".join(peers)},
        ),
        sock,
    )
    return server.run_forever(lambda: print(f"status: {server.url}/", flush=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
