"""A container's settings, from the environment the coordinator launches it with.

A container (``spark-elastic container run``) is configured by the
environment variables the coordinator sets (SAMZA-871 names the first):

=================================  ================================================
``EXECUTION_ENV_CONTAINER_ID``     the id the coordinator issued; required
``SPARK_ELASTIC_COORDINATOR_URL``  ``http://127.0.0.1:PORT``; required
``SPARK_ELASTIC_JOB``              ``module:attribute`` or ``file.py:attribute``; required
``SPARK_ELASTIC_MASTER``           Spark master URL (default ``local[2]``)
``SPARK_ELASTIC_CONF``             JSON object of extra Spark settings, over the job's
``SPARK_ELASTIC_HEARTBEAT_MS``     heartbeat interval (default 1000; first one at once)
``SPARK_ELASTIC_HEARTBEAT_RETRIES`` failed heartbeats in a row before giving up (6)
``SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS`` one request's time limit (twice the interval,
                                   1 to 5 s)
``SPARK_ELASTIC_SHUTDOWN_MS``      graceful-stop limit before a forced ``exit(1)`` (30000)
``SPARK_ELASTIC_WRITE_BUDGET_MS``  lease that must remain to start a write (3000)
``SPARK_ELASTIC_TOKEN``            bearer token, when the coordinator requires one
``SPARK_ELASTIC_FOLLOW_MS``        a stateful warm-up's shortest interval between
                                   snapshots of its old owners' state (10000)
``SPARK_ELASTIC_WARMUP``           how a stateful warm-up follows its old owners:
                                   ``replay`` (default, on the embedded log) or
                                   ``snapshot``
``SPARK_ELASTIC_ACCEPTABLE_LAG``   records a replaying warm-up may still have to
                                   apply when it says it is ready (10000, KIP-441's
                                   ``acceptable.recovery.lag``)
=================================  ================================================

Read by :meth:`ContainerSettings.from_env`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from spark_elastic.errors import ArgumentError, ProtocolError
from spark_elastic.runtime.protocol import (
    CONTAINER_ID_ENV,
    COORDINATOR_URL_ENV,
    COORDINATORS_ENV,
    JOB_ENV,
    validate_container_id,
)

__all__ = ["ContainerSettings"]


@dataclass(frozen=True)
class ContainerSettings:
    """A container's configuration, normally from its environment (:meth:`from_env`).

    Attributes
    ----------
    container_id
        The id the coordinator issued.
    coordinator_url
        The coordinator's base URL (the one that launched it).
    coordinator_urls
        Every coordinator of the job it may try, ``coordinator_url`` first
        (``SPARK_ELASTIC_COORDINATORS``: a leader's standbys).
    job
        The job spec, ``module:attribute`` or ``file.py:attribute``.
    master
        The Spark master URL.
    heartbeat_s
        Interval between heartbeats.
    heartbeat_retries
        Failed heartbeats in a row tolerated before the container gives up.
    heartbeat_timeout_s
        Time limit of one request to the coordinator; ``None`` for twice the
        interval, kept within 1 to 5 s (a frozen coordinator accepts
        connections but never answers, and a short limit keeps Samza's retries
        close to their interval).
    shutdown_s
        How long a graceful stop may take before a forced exit.
    write_budget_s
        Lease that must remain to start a write.
    token
        Bearer token for the coordinator, if it requires one.
    follow_s
        A stateful warm-up's shortest interval between two snapshots of its
        old owners' committed state.
    warmup
        How a stateful warm-up follows its old owners: ``"replay"`` (their
        records, from a snapshot, where the input has a gate) or
        ``"snapshot"`` (snapshots only).
    acceptable_lag
        Records a replaying warm-up may still have to apply when it registers
        as ready.
    spark_conf
        Extra Spark settings for this container's session (over the job's).
    """

    container_id: str
    coordinator_url: str
    job: str
    master: str = "local[2]"
    heartbeat_s: float = 1.0
    heartbeat_retries: int = 6
    heartbeat_timeout_s: float | None = None
    shutdown_s: float = 30.0
    write_budget_s: float = 3.0
    token: str | None = None
    follow_s: float = 10.0
    warmup: str = "replay"
    acceptable_lag: int = 10_000
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    coordinator_urls: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ContainerSettings:
        """Read the settings from environment variables (see the module docstring).

        Parameters
        ----------
        env
            The environment (default ``os.environ``).

        Returns
        -------
        ContainerSettings
            The settings.

        Raises
        ------
        ArgumentError
            A required variable is missing or a value is malformed; one line naming it.
        """
        env = os.environ if env is None else env
        missing = [v for v in (CONTAINER_ID_ENV, COORDINATOR_URL_ENV, JOB_ENV) if not env.get(v)]
        if missing:
            raise ArgumentError(
                f"{missing[0]}: expected the environment variable to be set (the coordinator "
                "sets it when it launches a container), found it unset"
            )
        try:
            container_id = validate_container_id(env[CONTAINER_ID_ENV], CONTAINER_ID_ENV)
        except ProtocolError as exc:
            raise ArgumentError(str(exc)) from None
        url = env[COORDINATOR_URL_ENV].rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ArgumentError.invalid(COORDINATOR_URL_ENV, "an http:// or https:// URL", url)
        others = [u.strip().rstrip("/") for u in env.get(COORDINATORS_ENV, "").split(",")]
        others = [u for u in others if u]
        wrong = [u for u in others if not u.startswith(("http://", "https://"))]
        if wrong:
            raise ArgumentError.invalid(COORDINATORS_ENV, "comma-separated http:// URLs", wrong[0])
        return cls(
            container_id=container_id,
            coordinator_url=url,
            coordinator_urls=tuple(dict.fromkeys([url, *others])),
            job=env[JOB_ENV],
            master=env.get("SPARK_ELASTIC_MASTER") or "local[2]",
            heartbeat_s=_millis(env, "SPARK_ELASTIC_HEARTBEAT_MS", 1000) / 1000,
            heartbeat_retries=int(_millis(env, "SPARK_ELASTIC_HEARTBEAT_RETRIES", 6)),
            heartbeat_timeout_s=_timeout(env),
            shutdown_s=_millis(env, "SPARK_ELASTIC_SHUTDOWN_MS", 30_000) / 1000,
            write_budget_s=_millis(env, "SPARK_ELASTIC_WRITE_BUDGET_MS", 3000) / 1000,
            token=env.get("SPARK_ELASTIC_TOKEN") or None,
            follow_s=_millis(env, "SPARK_ELASTIC_FOLLOW_MS", 10_000) / 1000,
            warmup=_choice(env, "SPARK_ELASTIC_WARMUP", ("replay", "snapshot")),
            acceptable_lag=int(_millis(env, "SPARK_ELASTIC_ACCEPTABLE_LAG", 10_000)),
            spark_conf=_conf(env.get("SPARK_ELASTIC_CONF") or "{}"),
        )


def _conf(text: str) -> dict[str, str]:
    try:
        conf = json.loads(text)
    except ValueError:
        conf = None
    if not isinstance(conf, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in conf.items()
    ):
        raise ArgumentError.invalid(
            "SPARK_ELASTIC_CONF", 'a JSON object of strings, e.g. {"spark.cores.max": "1"}', text
        )
    return conf


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    text = env.get(name) or choices[0]
    if text not in choices:
        raise ArgumentError.invalid(name, f"one of {', '.join(choices)}", text)
    return text


def _timeout(env: Mapping[str, str]) -> float | None:
    name = "SPARK_ELASTIC_HEARTBEAT_TIMEOUT_MS"
    if not env.get(name):
        return None
    millis = _millis(env, name, 0)
    if millis < 1:
        raise ArgumentError.invalid(name, "a whole number of milliseconds >= 1", env[name])
    return millis / 1000


def _millis(env: Mapping[str, str], name: str, default: int) -> float:
    text = env.get(name)
    if text is None or text == "":
        return float(default)
    if not (text.isascii() and text.isdigit()):
        raise ArgumentError.invalid(name, "a non-negative whole number", text)
    return float(int(text))
