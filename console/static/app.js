// jetcrew console: live updates over server-sent events. Every text from a
// run reaches the page through textContent, never as markup.
"use strict";

(function () {
  const body = document.body;
  const dot = document.getElementById("live");

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function link(href, text, cls) {
    const a = el("a", cls, text);
    a.href = href;
    return a;
  }
  function badge(state) {
    return el("span", "badge state-" + state, state);
  }
  function cell(tr, child, cls) {
    const td = el("td", cls);
    if (child instanceof Node) td.appendChild(child);
    else if (child !== undefined) td.textContent = child;
    tr.appendChild(td);
    return td;
  }

  function live(url, handlers) {
    const es = new EventSource(url);
    es.onopen = () => dot && dot.classList.add("on");
    es.onerror = () => dot && dot.classList.remove("on");
    for (const name in handlers) {
      es.addEventListener(name, (m) => handlers[name](JSON.parse(m.data)));
    }
    return es;
  }

  // swap fetches url, a page of the console, and puts its element id in
  // place of this page's, once prepare (when given) has seen it; it says
  // whether it did. A refused fetch or a page without the element changes
  // nothing.
  async function swap(url, id, prepare) {
    const res = await fetch(url, { headers: { Accept: "text/html" } });
    if (!res.ok) return false;
    const doc = new DOMParser().parseFromString(await res.text(), "text/html");
    const fresh = doc.getElementById(id);
    if (!fresh) return false;
    if (prepare) prepare(fresh);
    document.getElementById(id).replaceWith(document.adoptNode(fresh));
    return true;
  }

  // single returns fn made to skip a call while an earlier one runs.
  function single(fn) {
    let busy = false;
    return async () => {
      if (busy) return;
      busy = true;
      try {
        await fn();
      } finally {
        busy = false;
      }
    };
  }

  // Times: relative to now ("2 min ago") with the absolute time, in the
  // viewer's zone and in UTC, on hover; waits and durations still going
  // count on. The same words as the server's (console/times.go).
  function rel(ms) {
    const d = Date.now() - ms;
    if (d < 10000) return "just now";
    if (d < 60000) return Math.floor(d / 1000) + " s ago";
    if (d < 3600000) return Math.floor(d / 60000) + " min ago";
    if (d < 86400000) return Math.floor(d / 3600000) + " h ago";
    return Math.floor(d / 86400000) + " d ago";
  }
  function dur(ms) {
    if (ms < 0) ms = 0;
    if (ms >= 3600000) return Math.floor(ms / 3600000) + "h" + Math.floor((ms % 3600000) / 60000) + "m0s";
    if (ms < 1000) {
      const r = Math.round(ms);
      return r === 0 ? "0s" : r >= 1000 ? "1s" : r + "ms";
    }
    const s = Math.floor(ms / 1000);
    return s >= 60 ? Math.floor(s / 60) + "m" + (s % 60) + "s" : s + "s";
  }
  function utcClock(ms) {
    return new Date(ms).toISOString().replace("T", " ").replace("Z", "") + " UTC";
  }
  function zoned(t) {
    if (t.dataset.zoned) return;
    t.dataset.zoned = "1";
    const ms = Date.parse(t.getAttribute("datetime"));
    const local = new Date(ms).toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric",
      hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" });
    t.title = local + " · " + utcClock(ms);
  }
  function tick() {
    for (const t of document.querySelectorAll("time.rel")) {
      zoned(t);
      t.textContent = rel(Date.parse(t.getAttribute("datetime")));
    }
    for (const e of document.querySelectorAll(".dur[data-from]")) e.textContent = dur(Date.now() - Date.parse(e.dataset.from));
  }
  function when(iso) {
    if (!iso) return document.createTextNode("-");
    const t = el("time", "rel");
    t.setAttribute("datetime", iso);
    zoned(t);
    t.textContent = rel(Date.parse(iso));
    return t;
  }
  // spans returns a run's wait and run time elements, as waitSpan and
  // runSpan (console/times.go) say them.
  function spans(r) {
    function span(from, to, live) {
      const e = el("span", "dur");
      if (!from || (!live && !to)) e.textContent = "-";
      else if (live) {
        e.dataset.from = from;
        e.textContent = dur(Date.now() - Date.parse(from));
      } else e.textContent = dur(Date.parse(to) - Date.parse(from));
      return e;
    }
    const wait = r.started_at ? span(r.queued_at, r.started_at, false)
      : r.final ? span(r.queued_at, r.finished_at, false) : span(r.queued_at, "", true);
    const ran = !r.started_at ? span("", "", false)
      : r.finished_at ? span(r.started_at, r.finished_at, false) : span(r.started_at, "", !r.final);
    return [wait, ran];
  }
  tick();
  setInterval(tick, 1000);

  // Copy buttons copy the text of the element data-copy names.
  document.addEventListener("click", async (ev) => {
    const b = ev.target.closest && ev.target.closest("button.copy");
    if (!b) return;
    const src = document.getElementById(b.dataset.copy);
    if (!src) return;
    let ok = false;
    try {
      await navigator.clipboard.writeText(src.textContent);
      ok = true;
    } catch (e) {
      const range = document.createRange();
      range.selectNodeContents(src);
      const sel = getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      ok = document.execCommand("copy");
      sel.removeAllRanges();
    }
    b.textContent = ok ? "Copied" : "Select and copy";
    setTimeout(() => { b.textContent = "Copy"; }, 1500);
  });

  function runRow(r) {
    const tr = el("tr");
    tr.dataset.id = r.id;
    tr.dataset.activity = r.activity || "";
    cell(tr, link("/runs/" + encodeURIComponent(r.id), r.id), "mono");
    cell(tr, badge(r.state));
    cell(tr, r.pool);
    cell(tr, r.profile);
    cell(tr, r.group && r.group !== r.id ? link("/groups/" + encodeURIComponent(r.pool) + "/" + encodeURIComponent(r.group), r.group.length > 12 ? r.group.slice(0, 12) + "…" : r.group) : "-");
    const labels = cell(tr, undefined);
    for (const l of r.labels || []) {
      // A chip filters the list by its label, the other filters kept.
      const q = new URLSearchParams(location.search);
      q.delete("before");
      q.delete("label");
      q.append("label", l);
      const a = link("/runs?" + q.toString(), l);
      a.className = "label";
      a.title = "only runs with this label";
      labels.appendChild(a);
    }
    cell(tr, (r.worker || "").slice(0, 12), "mono");
    cell(tr, when(r.queued_at));
    const [wait, ran] = spans(r);
    cell(tr, wait, "mono");
    cell(tr, ran, "mono");
    cell(tr, r.usage, "num");
    cell(tr, r.reason, "reason");
    // A console that may act (its page has the rows' cancel form) offers
    // Cancel on a run not ended; the server asks for a confirmation.
    if (body.dataset.cancel !== undefined) {
      const td = cell(tr, undefined, "actions");
      if (!r.final) {
        const b = el("button", "cancel-one", "Cancel…");
        b.type = "submit";
        b.setAttribute("form", body.dataset.cancel);
        b.setAttribute("formaction", "/runs/" + encodeURIComponent(r.id) + "/cancel");
        b.dataset.run = r.id;
        td.appendChild(b);
      }
    }
    return tr;
  }

  const pages = {
    runs() {
      const tbody = document.getElementById("runs");
      live(body.dataset.live, {
        run(r) {
          const old = tbody.querySelector('tr[data-id="' + CSS.escape(r.id) + '"]');
          const tr = runRow(r);
          if (old) {
            // In place: the run's link (maybe being clicked) stays.
            for (const i of [1, 6, 7, 8, 9, 10, 11, 12]) {
              if (tr.children[i]) old.children[i].replaceWith(tr.children[i].cloneNode(true));
            }
            // A replay is the run's latest activity, which the list is
            // ordered by: on the first page it moves to the top.
            if (body.dataset.prepend && r.activity && old.dataset.activity !== r.activity) tbody.prepend(old);
            old.dataset.activity = r.activity || "";
            old.classList.remove("fresh");
            void old.offsetWidth; // restart the highlight
            old.classList.add("fresh");
          } else if (body.dataset.prepend) {
            tr.classList.add("fresh");
            tbody.prepend(tr);
            const total = document.getElementById("total");
            if (total) total.textContent = (parseInt(total.textContent, 10) + 1) + " run(s)";
          }
        },
      });
    },

    run() {
      // usage shows the run's model usage, budget line and "Raise
      // budget" form as its latest state has them.
      function usage(m) {
        const facts = m.facts || [];
        document.getElementById("usage").hidden = facts.length === 0 && !m.budget;
        const line = document.getElementById("budget");
        line.textContent = m.budget || "";
        line.hidden = !m.budget;
        const raise = document.getElementById("raise-form");
        if (raise) raise.hidden = !m.paused;
        const dl = document.getElementById("usage-facts");
        const items = [];
        for (const f of facts) items.push(el("dt", null, f.label), el("dd", null, f.text));
        dl.replaceChildren(...items);
      }
      // changes fetches the "Changes" section again when the run's
      // workspace result is another than the one shown.
      let fetching = "";
      async function changes(key) {
        const sec = document.getElementById("changes");
        if (!sec || sec.dataset.key === key || fetching === key) return;
        fetching = key;
        try {
          await swap("/runs/" + encodeURIComponent(body.dataset.run) + "/changes", "changes");
        } finally {
          fetching = "";
        }
      }
      const out = document.getElementById("output");
      const tl = document.getElementById("timeline");
      const agent = document.getElementById("agent");
      const coord = document.getElementById("coord");
      let last = 0;
      // Output comes in the order the worker read stdout and stderr in:
      // a chunk the stream stored late comes after later ones, so a
      // replay after a reconnect is told by the chunks already shown.
      const shown = new Set();
      live(body.dataset.live, {
        output(e) {
          if (shown.has(e.seq)) return;
          shown.add(e.seq);
          last = Math.max(last, e.seq);
          const follow = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
          out.appendChild(el("span", e.stream === "stderr" ? "stderr" : null, e.text));
          if (follow) out.scrollTop = out.scrollHeight;
        },
        event(e) {
          if (e.seq <= last) return;
          last = e.seq;
          const tr = el("tr");
          cell(tr, e.time, "mono");
          if (e.type === "agent") {
            cell(tr, e.kind);
            cell(tr, e.text, "wrap");
            agent.appendChild(tr);
          } else if (e.type === "coord") {
            cell(tr, e.kind);
            cell(tr, e.to ? "→ " + e.to : "");
            cell(tr, e.text, "wrap");
            coord.appendChild(tr);
          } else {
            if (e.type === "started" && out.childNodes.length > 0) {
              out.appendChild(el("span", "sep", "\n── started again (attempt " + e.attempt + ") ──\n"));
            }
            cell(tr, badge(e.type));
            cell(tr, e.attempt ? "attempt " + e.attempt : "");
            cell(tr, e.text, "wrap");
            cell(tr, e.kind, "mono");
            tl.appendChild(tr);
          }
        },
        state(r) {
          const s = document.getElementById("state");
          s.replaceWith(Object.assign(badge(r.state), { id: "state" }));
          document.getElementById("reason").textContent = r.reason;
          // A read-only console has no forms.
          const cancel = document.getElementById("cancel-form");
          if (cancel) cancel.hidden = r.final;
          const replay = document.getElementById("replay-form");
          if (replay) replay.hidden = !["failed", "timed_out", "stalled"].includes(r.state);
          // Every fact the page shows follows the run (issue 27): a run
          // ending, cancelled or replayed needs no reload.
          const facts = { worker: r.worker, container: r.container, attempts: r.attempts,
            "exit-code": r.exit_code, "output-bytes": r.output };
          for (const [id, v] of Object.entries(facts)) {
            const e = document.getElementById(id);
            if (e && v !== undefined) e.textContent = v;
          }
          for (const [id, iso] of [["queued", r.queued_at], ["started", r.started_at], ["finished", r.finished_at]]) {
            const e = document.getElementById(id);
            if (e && iso !== undefined) e.replaceChildren(when(iso));
          }
          const [wait, ran] = spans(r);
          document.getElementById("waited")?.replaceChildren(wait);
          document.getElementById("ran")?.replaceChildren(ran);
          for (const li of document.querySelectorAll("#commands li[data-cmd]")) {
            if (li.dataset.cmd === "cancel") li.hidden = r.final;
            if (li.dataset.cmd === "replay") li.hidden = !["failed", "timed_out", "stalled"].includes(r.state);
          }
          changes(r.changes || "");
          const warm = document.getElementById("warm");
          if (warm) warm.hidden = !r.warm;
          // A run's egress totals (upstream failures among them) show once
          // its proxy has some.
          const egress = document.getElementById("egress");
          if (egress && r.egress !== undefined) {
            egress.textContent = r.egress;
            egress.hidden = r.egress === "-";
            document.getElementById("egress-label").hidden = egress.hidden;
          }
          for (const id of ["result", "receipt"]) {
            const e = document.getElementById(id);
            if (!e || r[id] === undefined) continue;
            e.textContent = r[id];
            document.getElementById(id + "-section").hidden = !r[id];
          }
          const waiting = document.getElementById("waiting");
          if (waiting) waiting.hidden = r.state !== "queued";
          usage(r.model || {});
        },
      });
    },

    group() {
      const thread = document.getElementById("thread");
      const states = new Map();
      for (const tr of document.querySelectorAll("#runs tr[data-id]")) {
        states.set(tr.dataset.id, tr.querySelector(".badge").textContent);
      }
      // attempts fetches the runs' comparison again (outcomes, diffstats,
      // diffs) when a state brings another outcome or result than the
      // one shown, or a run joins the group.
      let busy = false, again = false;
      async function attempts() {
        if (busy) { again = true; return; }
        busy = true;
        try {
          await swap("/groups/" + encodeURIComponent(body.dataset.pool) + "/" + encodeURIComponent(body.dataset.group) + "/attempts", "attempts");
        } finally {
          busy = false;
          if (again) { again = false; attempts(); }
        }
      }
      let last = 0;
      live(body.dataset.live, {
        message(m) {
          if (m.seq <= last) return;
          last = m.seq;
          const tr = el("tr");
          cell(tr, m.time, "mono");
          cell(tr, m.from === "operator" ? "operator" : link("/runs/" + encodeURIComponent(m.from), m.from), "mono");
          const st = cell(tr, states.has(m.from) ? badge(states.get(m.from)) : "");
          st.dataset.run = m.from;
          cell(tr, m.to, "mono");
          cell(tr, m.text, "wrap message-text");
          cell(tr, m.bytes + " B", "num");
          thread.appendChild(tr);
        },
        state(r) {
          states.set(r.id, r.state);
          const tr = document.querySelector('#runs tr[data-id="' + CSS.escape(r.id) + '"]');
          if (tr) tr.children[1].replaceChildren(badge(r.state));
          if (!tr || tr.dataset.key !== r.key) attempts();
          for (const c of thread.querySelectorAll('td[data-run="' + CSS.escape(r.id) + '"]')) {
            c.replaceChildren(badge(r.state));
          }
        },
      });
    },

    overview() {
      live(body.dataset.live, { changed: single(() => swap("/overview/fragment", "overview-body")) });
    },
  };

  // The egress page swaps in a fresh list when its stream says it
  // changed, keeping the "for the whole profile" boxes ticked, and moves
  // the ages every second by itself.
  pages.egress = function () {
    function ages() {
      const now = Date.now();
      const fmt = (ms) => {
        const s = Math.max(0, Math.floor(ms / 1000));
        if (s < 60) return s + "s";
        if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60) + "s";
        return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m0s";
      };
      for (const td of document.querySelectorAll("#asks td[data-since]")) td.textContent = fmt(now - Number(td.dataset.since));
      for (const td of document.querySelectorAll("#asks td[data-until]")) td.textContent = fmt(Number(td.dataset.until) - now);
    }
    setInterval(ages, 1000);
    // keepTicked ticks, in the fresh list, the boxes ticked in this one.
    function keepTicked(fresh) {
      const ticked = new Set();
      for (const box of document.querySelectorAll("#asks tr[data-id] .for-profile:checked")) {
        ticked.add(box.closest("tr").dataset.id);
      }
      for (const tr of fresh.querySelectorAll("#asks tr[data-id]")) {
        const box = tr.querySelector(".for-profile");
        if (box && ticked.has(tr.dataset.id)) box.checked = true;
      }
    }
    live(body.dataset.live, {
      changed: single(async () => {
        if (await swap("/egress/fragment", "egress-body", keepTicked)) ages();
      }),
    });
  };

  const page = pages[body.dataset.page];
  if (page && body.dataset.live) page();
})();
