// A small line graph on a canvas: the last N samples, a fixed 0..max scale, the unit on the axis.
(() => {
  "use strict";

  class LineGraph {
    constructor(canvas, { max = 100, unit = "%", points = 120, color = "#2456c7" } = {}) {
      this.canvas = canvas;
      this.max = max;
      this.unit = unit;
      this.points = points;
      this.color = color;
      this.values = [];
    }

    push(value) {
      this.values.push(value);
      if (this.values.length > this.points) this.values.shift();
      this.draw();
    }

    draw() {
      const c = this.canvas;
      const g = c.getContext("2d");
      const w = c.width;
      const h = c.height;
      const left = this.unit === "bytes" ? 64 : 40; // room for the axis labels
      g.clearRect(0, 0, w, h);
      g.font = "11px system-ui, sans-serif";
      g.fillStyle = "#5d6878";
      g.strokeStyle = "#d9dee6";
      for (const frac of [0, 0.5, 1]) {
        const y = h - 14 - frac * (h - 24);
        g.beginPath();
        g.moveTo(left, y);
        g.lineTo(w, y);
        g.stroke();
        g.fillText(this.label(this.max * frac), 2, y + 4);
      }
      g.fillText(this.points + " s", w - 36, h - 2);
      if (this.values.length < 2) return;
      g.strokeStyle = this.color;
      g.lineWidth = 2;
      g.beginPath();
      const step = (w - left) / (this.points - 1);
      const start = this.points - this.values.length;
      this.values.forEach((v, i) => {
        const x = left + (start + i) * step;
        const y = h - 14 - Math.min(v / this.max, 1) * (h - 24);
        if (i === 0) g.moveTo(x, y);
        else g.lineTo(x, y);
      });
      g.stroke();
    }

    label(v) {
      if (this.unit === "bytes") return formatBytes(v);
      return Math.round(v) + this.unit;
    }
  }

  function formatBytes(n) {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let v = n;
    while (v >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return (i === 0 ? String(v) : v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)) + " " + units[i];
  }

  window.SwitchyardChart = { LineGraph, formatBytes };
})();
