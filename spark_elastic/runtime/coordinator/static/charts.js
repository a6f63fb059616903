// The status page's charts: glue between /history.json and uPlot (vendored beside this file).
// Every SAMPLE_S it fetches the history of the chosen window and the page's live parts, and
// redraws in place: no reload. Each chart's element says what it drew, for people reading
// the DOM and for the browser spec: data-points (non-null points) and data-bands (changes).
(function () {
  "use strict";
  const root = document.getElementById("charts");
  if (!root || typeof uPlot === "undefined") return;
  const sampleMs = 1000 * Number(root.dataset.sampleS || 2);
  const BAND = {
    scale: "rgba(66, 133, 244, 0.16)",
    factor: "rgba(156, 39, 176, 0.14)",
    growth: "rgba(0, 150, 136, 0.16)",
    "warm-up": "rgba(255, 167, 38, 0.22)",
    failover: "rgba(229, 57, 53, 0.16)",
    stop: "rgba(120, 120, 120, 0.22)",
  };
  const GOOD = new Set(["done", "ready", "registered", "resumed"]);
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  let windowS = 300;
  let history = null;
  const charts = {};

  function strip(span) {
    if (span.endedAt === null) return "#2b6cb0";
    return GOOD.has(span.result) ? "#2a7a2a" : "#c0392b";
  }

  // Drawn under the lines: one band per change, a strip on top saying how it ended.
  function drawBands(u) {
    if (!history) return;
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    let drawn = 0;
    ctx.save();
    for (const span of history.spans) {
      const end = span.endedAt === null ? history.now : span.endedAt;
      let x0 = u.valToPos(span.startedAt, "x", true);
      let x1 = u.valToPos(end, "x", true);
      x0 = Math.max(x0, left);
      x1 = Math.min(Math.max(x1, x0 + 2), left + width);
      if (x1 <= left || x0 >= left + width) continue;
      ctx.fillStyle = BAND[span.kind] || "rgba(0,0,0,0.1)";
      ctx.fillRect(x0, top, x1 - x0, height);
      ctx.fillStyle = strip(span);
      ctx.fillRect(x0, top, x1 - x0, 4 * devicePixelRatio);
      drawn += 1;
    }
    ctx.restore();
    u.root.parentNode.dataset.bands = String(drawn);
  }

  // The window, or less while the history is shorter (a new job's charts fill the width).
  function xMin() {
    const start = history.now - windowS;
    const first = history.t.length ? history.t[0] : start;
    return Math.max(start, Math.min(first, history.now - 60));
  }

  function points(data) {
    let n = 0;
    for (let i = 1; i < data.length; i++) for (const v of data[i]) if (v !== null) n++;
    return n;
  }

  function draw(id, title, lines, data, yLabel) {
    const el = document.getElementById(id);
    const key = [title].concat(lines.map((l) => l.label)).join("\u0000");
    const width = Math.max(400, el.clientWidth || root.clientWidth || 900);
    let chart = charts[id];
    if (chart && chart.key !== key) {
      chart.plot.destroy();
      chart = null;
    }
    if (!chart) {
      el.innerHTML = "";
      const h = document.createElement("h3");
      h.textContent = title;
      el.appendChild(h);
      const opts = {
        width: width,
        height: 170,
        scales: {
          x: { time: true, min: xMin(), max: history.now },
          // Rates, lag and durations start at 0: a dip is not drawn as a cliff.
          y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] },
        },
        axes: [{}, { label: yLabel, size: 60 }],
        series: [{}].concat(lines.map((l, i) => ({
          label: l.label,
          stroke: l.color || PALETTE[i % PALETTE.length],
          width: l.width || 1.5,
          spanGaps: false,
          points: { show: false },
        }))),
        hooks: { drawClear: [drawBands] },
        legend: { live: true },
      };
      chart = { key: key, plot: new uPlot(opts, data, el) };
      charts[id] = chart;
    } else {
      chart.plot.batch(() => {
        chart.plot.setScale("x", { min: xMin(), max: history.now });
        chart.plot.setData(data, false);
      });
    }
    el.dataset.points = String(points(data));
  }

  function column(values) {
    return values.map((v) => (v === undefined ? null : v));
  }

  function drawAll() {
    const t = history.t;
    const job = history.job;
    draw("chart-rate", document.getElementById("chart-rate").dataset.title,
      [{ label: "read", color: "#1f77b4" }, { label: "processed", color: "#2ca02c", width: 2 }],
      [t, column(job.read), column(job.processed)], "records/s");
    const top = history.topTasks;
    draw("chart-lag", document.getElementById("chart-lag").dataset.title,
      [{ label: "job", color: "#222", width: 2 }].concat(top.map((task) => ({ label: task }))),
      [t, column(job.lag)].concat(top.map((task) => column(history.tasks[task].lag))), "records");
    const ids = Object.keys(history.containers);
    const secs = (ms) => ms.map((v) => (v === null || v === undefined ? null : v / 1000));
    draw("chart-batch", document.getElementById("chart-batch").dataset.title,
      ids.map((id) => ({ label: id })),
      [t].concat(ids.map((id) => secs(history.containers[id].batchMs))), "s");
    draw("chart-containers", document.getElementById("chart-containers").dataset.title,
      ids.map((id) => ({ label: id })),
      [t].concat(ids.map((id) => column(history.containers[id].processed))), "records/s");
    draw("chart-containers-read", document.getElementById("chart-containers-read").dataset.title,
      ids.map((id) => ({ label: id })),
      [t].concat(ids.map((id) => column(history.containers[id].read))), "records/s");
    drawTask();
    listChanges();
  }

  function chosenTask() {
    const m = /^#task=(.+)$/.exec(decodeURIComponent(location.hash));
    return m ? m[1] : null;
  }

  function drawTask() {
    const el = document.getElementById("chart-task");
    const task = chosenTask();
    if (!task || !history.tasks[task]) {
      el.hidden = true;
      return;
    }
    el.hidden = false;
    const series = history.tasks[task];
    draw("chart-task", "Task " + task + ": its lag (records) and its partitions' records " +
      "committed per second", [{ label: "lag", color: "#d62728" },
      { label: "records/s", color: "#1f77b4" }],
      [history.t, column(series.lag), column(series.rate)], "");
  }

  function time(s) {
    return s === null ? "-" : new Date(s * 1000).toLocaleTimeString();
  }

  function listChanges() {
    const table = document.getElementById("changes");
    const rows = history.spans.slice().reverse().map((s) => {
      const tr = document.createElement("tr");
      const cells = [s.kind, s.label, time(s.startedAt), s.endedAt === null ? "under way" :
        time(s.endedAt), s.endedAt === null ? "" : s.outcome];
      for (const text of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      tr.firstChild.style.background = BAND[s.kind] || "";
      tr.lastChild.style.color = s.endedAt === null ? "" : strip(s);
      return tr;
    });
    table.replaceChildren(table.rows[0], ...rows);
  }

  async function refresh() {
    try {
      const json = (r) => {
        if (!r.ok) throw new Error(r.url + ": HTTP " + r.status);  // 429, a standby's 409
        return r.json();
      };
      const [h, live] = await Promise.all([
        fetch("history.json?window=" + windowS).then(json),
        fetch("?fragment=1").then(json),
      ]);
      document.getElementById("head").innerHTML = live.head;
      document.getElementById("tables").innerHTML = live.tables;
      if (h.t) {
        history = h;
        drawAll();
      }
      root.dataset.updated = String(Date.now());
    } catch (e) {
      root.dataset.error = String(e);  // the coordinator away: the next poll tries again
    }
  }

  for (const a of root.querySelectorAll("[data-window]")) {
    a.addEventListener("click", (ev) => {
      ev.preventDefault();
      windowS = Number(a.dataset.window);
      for (const b of root.querySelectorAll("[data-window]")) b.classList.toggle("on", b === a);
      refresh();
    });
    a.classList.toggle("on", Number(a.dataset.window) === windowS);
  }
  window.addEventListener("hashchange", () => {
    if (history) drawTask();
    const el = document.getElementById("chart-task");
    if (!el.hidden) el.scrollIntoView();
  });
  refresh();
  setInterval(refresh, sampleMs);
})();
