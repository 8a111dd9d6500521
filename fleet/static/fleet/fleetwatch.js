// Progressive enhancement only: the overview's chart. Pages read fine without it (the same
// numbers are in the table under the chart).
(function () {
  "use strict";
  function draw() {
    var canvas = document.getElementById("per-day-chart");
    var source = document.getElementById("per-day-data");
    var palette = document.getElementById("culprit-colours");
    if (!canvas || !source || !palette || typeof Chart === "undefined") return;
    var perDay = JSON.parse(source.textContent);
    // The page's palette (analysis/palette.py), the one the weekly report draws with.
    var COLOURS = JSON.parse(palette.textContent);
    var datasets = Object.keys(perDay.series).map(function (culprit) {
      return { label: culprit, data: perDay.series[culprit], backgroundColor: COLOURS[culprit] || COLOURS.unknown };
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
