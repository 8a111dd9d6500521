// Progressive enhancement only: the overview's chart. Pages read fine without it (the same
// numbers are in the table under the chart).
(function () {
  "use strict";
  var COLOURS = {
    bad_node_hardware: "#dc2626", network_transport: "#f59e0b", storage_io: "#a16207",
    dataloader_cpu: "#7c3aed", rank_desync_code: "#0284c7", parallelism_config: "#0d9488",
    oom_or_crash: "#be185d", timeout_too_short: "#65a30d", software_version: "#4f46e5",
    unknown: "#94a3b8"
  };
  function draw() {
    var canvas = document.getElementById("per-day-chart");
    var source = document.getElementById("per-day-data");
    if (!canvas || !source || typeof Chart === "undefined") return;
    var perDay = JSON.parse(source.textContent);
    var datasets = Object.keys(perDay.series).map(function (culprit) {
      return { label: culprit, data: perDay.series[culprit], backgroundColor: COLOURS[culprit] || "#64748b" };
    });
    new Chart(canvas, {
      type: "bar",
      data: { labels: perDay.days, datasets: datasets },
      options: {
        animation: false, maintainAspectRatio: false,
        scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } } }
      }
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
