"""The status page: what an operator reads first, tables of the job, and live charts.

Server-side HTML for the tables (the job, its coordinator, containers,
warm-ups, tasks, events), and a shell around them for the charts: the page
loads uPlot (vendored in ``static/``, served by the coordinator itself, so
the page needs no internet) and ``static/charts.js`` (the glue), which
poll ``/history.json`` and the tables (``/?fragment=1``) every
:data:`.history.SAMPLE_S` and redraw without a reload. Without scripts the
page still refreshes itself every 2 s.

Pure: functions of :meth:`.supervisor.Supervisor.status`'s document.

May import: :mod:`.status`, :mod:`.history` and the standard library.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any

from spark_elastic.runtime.coordinator.history import SAMPLE_S, WINDOWS_S
from spark_elastic.runtime.coordinator.status import coordinator_line

__all__ = ["render_fragment", "render_page"]


def _monitor_line(monitor: dict[str, Any]) -> str:
    e = html.escape
    unread = ""
    if monitor["unread"]:
        records = sum(end for ends in monitor["unread"].values() for end in ends.values())
        unread = (
            f" Not read by any task yet: {e(json.dumps(monitor['unread']))} ({records:,} "
            "records, counted in the input lag)."
        )
    if monitor["growth"] is not None:
        growth = monitor["growth"]
        return (
            f"<p class='growth'>Partition growth to {e(json.dumps(growth['counts']))}: old "
            f"partitions drain to {e(json.dumps(growth['barrier']))} first.{unread}</p>"
        )
    if monitor["growthWaiting"] is not None:
        return (
            f"<p class='growth'>Partition growth to "
            f"{e(json.dumps(monitor['growthWaiting']['counts']))} waits for the change in "
            f"flight, which can no longer be rolled back, to end.{unread}</p>"
        )
    if monitor["refused"]:
        return f"<p class='refused'>Partition change not followed: {e(monitor['refused'])}</p>"
    if monitor["checkEveryS"] is None:
        return "<p>Partition monitor off.</p>"
    return (
        f"<p>Partition monitor: every {monitor['checkEveryS']:g} s; tasks planned for "
        f"{e(json.dumps(monitor['plannedPartitions']))}.</p>"
    )


def _input_line(health: dict[str, Any]) -> str:
    """Whether the input answers the coordinator: an outage as what it is, during a change too."""
    e = html.escape
    if health["state"] == "failing":
        since = time.strftime("%H:%M:%S", time.localtime(health["failingSince"]))
        failing = "; ".join(f"{call}: {detail}" for call, detail in health["failing"].items())
        line = (
            f"<p class='input failing'>Input failing since {since} "
            f"({health['failingForS']:.0f} s): {e(failing)}."
        )
    elif health["state"] == "answering":
        at = time.strftime("%H:%M:%S", time.localtime(health["lastAnswerAt"]))
        line = f"<p class='input'>Input answering (last answer {at})."
    else:
        line = "<p class='input'>Input not asked yet."
    if health["clientRestarts"]:
        line += (
            f" Its client process was started again {health['clientRestarts']} times "
            f"(last: {e(health['clientLastDeath'])})."
        )
    return line + "</p>"


def _autoscaler_line(autoscaler: dict[str, Any]) -> str:
    e = html.escape
    line = f"<p class='autoscaler'>Autoscaler {e(autoscaler['summary'])}."
    last = autoscaler["lastDecision"]
    if last is not None:
        at = time.strftime("%H:%M:%S", time.localtime(last["at"]))
        line += (
            f" Last decision ({at}): {e(last['action'])} at {last['target']} "
            f"({e(last['rule'])}): {e(last['reason'])}"
        )
    return line + "</p>"


def _move_section(move: dict[str, Any] | None) -> str:
    """A pending stateful move (KIP-441): its phase and each warm-up's tasks and old owners."""
    if move is None:
        return "<p>No move pending.</p>"
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(w['containerId'])}</td><td>{e(w['state'])}</td>"
        f"<td>{e(', '.join(w['tasks']))}</td><td>{e(', '.join(w['from']))}</td></tr>"
        for w in move["warmups"]
    )
    return (
        f"<p>Pending move: {e(move['phase'])}. The old owners keep their tasks until every "
        "warm-up is ready.</p>"
        "<table><tr><th>warm-up</th><th>state</th><th>tasks it will take</th>"
        f"<th>from</th></tr>{rows}</table>"
    )


_LIVE = ("launching", "warm", "running")


def _job_line(status: dict[str, Any]) -> str:
    """The job's state and the change in flight, with its target: what an operator asks first."""
    e = html.escape
    state = status["jobState"]
    line = f"<p class='job {e(state['state'])}'>Job {e(state['state'])}"
    if state["state"] != "running" and state["why"]:
        line += f": {e(state['why'])}"
    lag = status["inputLag"]
    line += f". Input lag: {'unknown' if lag is None else f'{lag:,} records'}."
    enforced = status.get("recordsEnforced")
    if enforced is not None:
        # Kafka Streams' enforced-processing: placed in time without their other partitions.
        line += f" Records processed without waiting (enforced): {enforced:,}."
    line += "</p>"
    change = status["change"]
    if change is not None:
        deadline = (
            ""
            if change["deadlineS"] is None
            else f" (deadline {change['deadlineS']:.0f} s, then {change['atDeadline']})"
        )
        cancel = " It can be cancelled (job scale URL --cancel)." if change["cancellable"] else ""
        line += (
            f"<p class='change'>Change in flight: {e(change['description'])}, "
            f"{change['inPhaseS']:.0f} s in this phase{deadline}.{cancel}</p>"
        )
    return line


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def _head(status: dict[str, Any]) -> str:
    """What an operator asks first: the job, its state and change, its coordinator, input."""
    e = html.escape
    lease = status["lease"]
    return f"""<h1>Job {e(status["job"])}: job model {status["jobModelVersion"]},
elasticity factor {status["elasticityFactor"]}</h1>
{_job_line(status)}
<p class="coordinator{" failing" if status["coordinator"]["storeError"] else ""}">{
        e(coordinator_line(status["coordinator"]))
    }</p>
<p>Partitions: {e(json.dumps(status["partitions"]))}. Lease {lease["leaseS"]} s,
margin {lease["marginS"]} s, write budget {lease["writeBudgetS"]} s.</p>
{"" if status["partitionMonitor"]["checkEveryS"] is None else _input_line(status["input"])}
{_monitor_line(status["partitionMonitor"])}
{_autoscaler_line(status["autoscaler"])}"""


def _tables(status: dict[str, Any]) -> str:
    """Containers, warm-ups, tasks (each linking to its own chart), recent events."""
    e = html.escape
    rows = []
    ended: dict[str, int] = {}
    for c in status["containers"]:
        if c["state"] not in _LIVE:
            ended[c["state"]] = ended.get(c["state"], 0) + 1
            if not c.get("cause"):
                continue  # folded away: counted below the table
        lease = c["leaseLeftS"]
        lease_state = "-" if lease is None else ("valid" if lease > 0 else "expired")
        if lease is None and c.get("startupLeftS") is not None:
            lease_state = f"starting ({c['startupLeftS']:.0f} s left to register)"
        elif c.get("cause"):
            lease_state = f"failed: {c['cause']}"
        amplification = c["readAmplification"]
        batch_ms = c.get("lastBatchMs")
        rows.append(
            f"<tr class='{e(c['state'])}'><td>{e(c['containerId'])}</td><td>{e(c['state'])}</td>"
            f"<td>{c['pid'] or '-'}</td><td>{c['generation']}</td>"
            f"<td>{e(', '.join(c['tasks']))}</td><td>{_age(c['heartbeatAgeS'])}</td>"
            f"<td>{e(lease_state)}{'' if lease is None else f' ({_age(lease)})'}</td>"
            f"<td>{_or_dash(c['lastBatch'])}"
            f"{'' if batch_ms is None else f' ({batch_ms / 1000:.2f} s)'}</td>"
            f"<td>{'-' if amplification is None else f'{amplification:.2f}'}</td></tr>"
        )
    tasks = "".join(
        f"<tr><td><a href='#task={e(t['task'])}' title='its lag and rate'>{e(t['task'])}</a></td>"
        f"<td>{e(t['container'] or '-')}</td>"
        f"<td>{e(json.dumps(t['offsets']))}</td><td>{t['lag'] if t['lag'] >= 0 else '-'}</td></tr>"
        for t in status["tasks"]
    )
    events = "".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(ev['at']))}</td>"
        f"<td>{e(ev['kind'])}</td><td>{e(ev['container'])}</td><td>{e(ev['detail'])}</td></tr>"
        for ev in status["events"]
    )
    folded = ", ".join(f"{n} {state}" for state, n in sorted(ended.items()))
    return f"""<h2>Containers</h2>
<table><tr><th>container</th><th>state</th><th>pid</th><th>generation</th><th>virtual tasks</th>
<th>heartbeat age</th><th>lease</th><th>last batch (its duration)</th>
<th>read amplification</th></tr>
{"".join(rows)}</table>
<p>Ended containers (not shown unless they failed): {folded or "none"}.</p>
<h2>Warm-ups and pending moves</h2>
{_move_section(status["move"])}
<h2>Tasks</h2>
<table><tr><th>task</th><th>container</th><th>committed offsets</th><th>input lag</th></tr>
{tasks}</table>
<h2>Recent events</h2>
<table><tr><th>time</th><th>event</th><th>container</th><th>detail</th></tr>{events}</table>"""


def render_fragment(status: dict[str, Any]) -> dict[str, str]:
    """The page's live parts, for its script to swap in: ``{"head", "tables"}`` (HTML)."""
    return {"head": _head(status), "tables": _tables(status)}


_CHARTS = """<section id="charts" data-sample-s="{sample_s:g}">
<h2>Recent history <span class="windows">{windows}</span></h2>
<p class="bands">Bands: each change from its start to its end (a strip on top says how it
ended: <span class="ok">done, ready, registered, resumed</span>, <span class="bad">rolled back,
cut short or any other end</span>, <span class="on">still under way</span>).</p>
<div class="chart" id="chart-rate" data-title="Records per second (job)"></div>
<div class="chart" id="chart-lag" data-title="Input lag, records (job, and the tasks with most)">
</div>
<div class="chart" id="chart-batch"
 data-title="Micro-batch duration, seconds (longest per container in each interval)"></div>
<div class="chart" id="chart-containers"
 data-title="Records processed per second, per container"></div>
<div class="chart" id="chart-containers-read"
 data-title="Records read per second, per container (its tasks' partitions, other buckets too)">
</div>
<div class="chart" id="chart-task" hidden></div>
<table id="changes"><tr><th>change</th><th>what</th><th>from</th><th>to</th><th>outcome</th>
</tr></table>
</section>"""


def render_page(status: dict[str, Any]) -> str:
    """The status page: the job, its charts, containers, warm-ups, tasks, leases, lag,
    read amplification, autoscaler, events.

    Parameters
    ----------
    status
        :meth:`.supervisor.Supervisor.status`.

    Returns
    -------
    str
        An HTML page whose assets the coordinator serves (``static/``); its
        script redraws it every :data:`.history.SAMPLE_S`, and without
        scripts it refreshes itself every 2 s.
    """
    e = html.escape
    windows = " ".join(f"<a href='#' data-window='{w}'>{w // 60} min</a>" for w in WINDOWS_S)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<noscript><meta http-equiv="refresh" content="2"></noscript>
<title>spark-elastic: {e(status["job"])}</title>
<link rel="stylesheet" href="static/uPlot.min.css">
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1400px; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f0f0f0; }} tr.expired td, tr.retired td {{ color: #999; }}
p.job.failed, p.input.failing, p.coordinator.failing {{ color: #b00; font-weight: bold; }}
p.change {{ color: #a60; }}
tr.running td:nth-child(2) {{ color: #070; }} tr.warm td:nth-child(2) {{ color: #a60; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; }}
#charts .chart {{ margin: 0.5em 0 1em; }} #charts .chart h3 {{ font-size: 14px; margin: 0; }}
.windows a {{ font-weight: normal; font-size: 13px; margin-left: 0.6em; }}
.windows a.on {{ font-weight: bold; text-decoration: none; color: #222; }}
.ok {{ color: #2a7a2a; }} .bad {{ color: #c0392b; }} .on {{ color: #2b6cb0; }}
p.bands {{ font-size: 12px; color: #555; }}
</style></head><body>
<div id="head">{_head(status)}</div>
{_CHARTS.format(sample_s=SAMPLE_S, windows=windows)}
<div id="tables">{_tables(status)}</div>
<script src="static/uPlot.iife.min.js"></script>
<script src="static/charts.js"></script>
</body></html>
"""
