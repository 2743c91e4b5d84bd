/* A small line chart drawn as inline SVG (no library): time on x, counts on y, one polyline
   and one dot per point for each series. Exposed as window.SvgChart.draw(). */
"use strict";
(function () {
  const NS = "http://www.w3.org/2000/svg";

  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function niceMax(v) {
    if (v <= 4) return 4;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function clock(t) {
    const d = new Date(t);
    return d.toISOString().slice(11, 16);
  }

  /* series: [{name, cls, points: [{t: ms, v: number}]}]; from/to: ms */
  function draw(title, series, from, to) {
    const W = 640, H = 220, L = 44, R = 12, T = 26, B = 30;
    const svg = el("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title,
    });
    svg.appendChild(el("title", {}, title));
    svg.appendChild(el("text", { x: L, y: 16, class: "chart-title" }, title));
    const all = series.flatMap((s) => s.points.map((p) => p.v));
    const ymax = niceMax(Math.max(1, ...all));
    const x = (t) => L + ((t - from) / Math.max(1, to - from)) * (W - L - R);
    const y = (v) => H - B - (v / ymax) * (H - T - B);
    const grid = el("g", { class: "grid" });
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      grid.appendChild(el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      grid.appendChild(el("text", { x: L - 6, y: y(v) + 4, class: "tick y" },
        Number.isInteger(v) ? String(v) : v.toFixed(1)));
    }
    for (let i = 0; i <= 4; i++) {
      const t = from + ((to - from) * i) / 4;
      const anchor = i === 0 ? "start" : i === 4 ? "end" : "middle"; // stay inside the frame
      grid.appendChild(el("text", {
        x: x(t), y: H - 10, class: "tick x", "text-anchor": anchor,
      }, clock(t)));
    }
    svg.appendChild(grid);
    series.forEach((s, i) => {
      const g = el("g", { class: `series ${s.cls}`, "data-series": s.name });
      const pts = s.points.filter((p) => p.t >= from && p.t <= to);
      if (pts.length > 1) {
        g.appendChild(el("polyline", {
          points: pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" "),
        }));
      }
      for (const p of pts) {
        const dot = el("circle", { cx: x(p.t).toFixed(1), cy: y(p.v).toFixed(1), r: 2.5 });
        dot.appendChild(el("title", {}, `${s.name} ${p.v} at ${new Date(p.t).toISOString()}`));
        g.appendChild(dot);
      }
      svg.appendChild(g);
      const lx = W - R - 200 + i * 100;
      svg.appendChild(el("rect", { x: lx, y: 8, width: 10, height: 10, class: `swatch ${s.cls}` }));
      svg.appendChild(el("text", { x: lx + 14, y: 17, class: "legend" }, s.name));
    });
    if (!series.some((s) => s.points.length)) {
      svg.appendChild(el("text", { x: W / 2, y: H / 2, class: "empty" },
        "no reading in this window yet"));
    }
    return svg;
  }

  function seconds(s) {
    s = Math.round(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  }

  /* rows: [{label, median, p90, samples}] (seconds): one bar per row, the median solid and
     the p90 as a lighter bar behind it, both labelled, with the sample count. */
  function bars(title, rows) {
    const W = 640, L = 170, R = 210, T = 26, ROW = 22, B = 8;
    const H = T + Math.max(1, rows.length) * ROW + B;
    const svg = el("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "chart boots", role: "img", "aria-label": title,
    });
    svg.appendChild(el("title", {}, title));
    svg.appendChild(el("text", { x: 4, y: 16, class: "chart-title" }, title));
    const xmax = Math.max(1, ...rows.map((r) => r.p90));
    const x = (v) => L + (v / xmax) * (W - L - R);
    rows.forEach((r, i) => {
      const y = T + i * ROW;
      const g = el("g", { class: "boot", "data-key": r.label });
      g.appendChild(el("text", { x: L - 6, y: y + 14, class: "tick y" }, r.label));
      g.appendChild(el("rect", {
        x: L, y: y + 3, width: Math.max(1, x(r.p90) - L).toFixed(1), height: 14, class: "p90",
      }));
      const med = el("rect", {
        x: L, y: y + 3, width: Math.max(1, x(r.median) - L).toFixed(1), height: 14, class: "median",
      });
      med.appendChild(el("title", {}, `median ${seconds(r.median)}, p90 ${seconds(r.p90)}`));
      g.appendChild(med);
      g.appendChild(el("text", { x: x(r.p90) + 6, y: y + 14, class: "legend" },
        `${seconds(r.median)} · p90 ${seconds(r.p90)} · ${r.samples} boot${r.samples === 1 ? "" : "s"}`));
      svg.appendChild(g);
    });
    if (!rows.length) {
      svg.appendChild(el("text", { x: W / 2, y: T + 14, class: "empty" },
        "no cold boot in the last 7 days"));
    }
    return svg;
  }

  window.SvgChart = { draw, bars };
})();
