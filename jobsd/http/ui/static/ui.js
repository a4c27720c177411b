// jobsd dashboard: confirmations and live refresh. No build step, no dependency.
"use strict";

// A form with data-confirm asks before it is sent.
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// An element with an id and data-refresh="ms" is replaced by the same element of a
// fresh copy of the page every ms milliseconds, while the tab is visible. Refreshing
// stops when the fresh copy no longer asks for it (a job that has finished).
function refresh(element) {
  const every = Number(element.getAttribute("data-refresh"));
  if (!element.id || !every) {
    return;
  }
  const tick = async () => {
    if (document.hidden) {
      window.setTimeout(tick, every);
      return;
    }
    let fresh = null;
    try {
      const response = await fetch(window.location.href, {
        credentials: "same-origin",
        headers: { "X-Requested-With": "jobsd-ui" },
      });
      if (response.redirected || !response.ok) {
        window.setTimeout(tick, every * 3);
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      fresh = page.getElementById(element.id);
    } catch (error) {
      window.setTimeout(tick, every * 3);
      return;
    }
    if (!fresh) {
      return;
    }
    const current = document.getElementById(element.id);
    current.replaceWith(fresh);
    document.body.setAttribute("data-refreshed", String(Date.now()));
    if (fresh.getAttribute("data-refresh")) {
      element = fresh;
      window.setTimeout(tick, every);
    }
  };
  window.setTimeout(tick, every);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refresh);
});
