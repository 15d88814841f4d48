// hpcrun serve: live updates of a running run's page (server-sent events
// carry the new HTML of the summary, charts and logs), and the runs page's
// compare button and refresh. No framework, no build step.
"use strict";
(function () {
  const live = document.querySelector("[data-events]");
  if (live) {
    const badge = live.querySelector(".live");
    const es = new EventSource(live.dataset.events);
    es.addEventListener("update", (e) => {
      const parts = JSON.parse(e.data);
      for (const id in parts) {
        const el = document.getElementById(id);
        if (el) el.innerHTML = parts[id];
      }
      if (badge) { badge.classList.remove("stale"); badge.title = "updated " + new Date().toLocaleTimeString(); }
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    });
    es.onerror = () => { if (badge) badge.classList.add("stale"); };
  }
  const form = document.getElementById("compare-form");
  if (form) {
    const button = document.getElementById("compare");
    const sync = () => { button.disabled = form.querySelectorAll("input[name=run]:checked").length < 1; };
    form.addEventListener("change", sync);
    sync();
    // The runs page reads again every 15 s, unless runs are being ticked.
    setInterval(() => { if (!form.querySelector("input[name=run]:checked")) location.reload(); }, 15000);
  }
})();
