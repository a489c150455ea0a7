// The page's model picker, shown when the server is a router (`tandem serve --models-dir` or
// `--models-preset`): LM Studio's workflow. Pick the target; the draft list is every other
// model of the server's catalog, the ones `tandem check` refuses greyed out with the rule that
// refuses them (GET /models/drafts); the memory plan of the pick; "Load" (POST /models/load
// with Tandem's "draft" field). Answers then go to the picked model; "Compare without
// speculation" works as with one model. Uses app.js's api(); app.js asks Picker.model().
"use strict";

const Picker = {
  on: false, // the server is a router
  loaded: null, // {model, draft} the answers go to
  drafts: null, // the last GET /models/drafts answer

  model() {
    return this.on && this.loaded ? this.loaded.model : null;
  },

  // ?model= for the GET routes a router forwards (/props, /slots, /metrics)
  query() {
    const m = this.model();
    return m ? "?model=" + encodeURIComponent(m) : "";
  },

  async start() {
    this.on = true;
    document.getElementById("models").hidden = false;
    document.getElementById("pick-target").addEventListener("change", () => this.target());
    document.getElementById("pick-draft").addEventListener("change", () => this.showPlan());
    document.getElementById("pick-load").addEventListener("click", () => this.load());
    await this.list();
  },

  status(item) {
    const s = item.status;
    return typeof s === "string" ? s : (s && s.value) || "unloaded";
  },

  // the catalog into the target list; the loaded model (and its draft) picked
  async list() {
    const items = (await (await api("models")).json()).data || [];
    const sel = document.getElementById("pick-target");
    const keep = sel.value;
    sel.replaceChildren();
    let loaded = null;
    for (const it of items) {
      const o = document.createElement("option");
      const st = this.status(it);
      o.value = it.id;
      o.textContent = st === "unloaded" ? it.id : `${it.id} (${st})`;
      sel.append(o);
      if (st === "loaded" && !loaded) loaded = it;
    }
    if (loaded && !this.loaded) this.loaded = { model: loaded.id, draft: loaded.draft || null };
    sel.value = keep || (this.loaded ? this.loaded.model : (items[0] && items[0].id) || "");
    await this.target();
    this.say();
  },

  // the drafts for the picked target: accepted ones selectable, refused ones greyed with the rule
  async target() {
    const model = document.getElementById("pick-target").value;
    const sel = document.getElementById("pick-draft");
    const refused = document.getElementById("pick-refused");
    sel.replaceChildren(new Option("none (the target alone)", ""));
    refused.replaceChildren();
    if (!model) return;
    document.getElementById("pick-plan").textContent = "Reading the models…";
    let drafts;
    try {
      drafts = await (await api("models/drafts?model=" + encodeURIComponent(model))).json();
    } catch (e) {
      drafts = { error: e.message };
    }
    // another target picked while this one was read: its own answer fills the lists
    if (document.getElementById("pick-target").value !== model) return;
    sel.replaceChildren(new Option("none (the target alone)", ""));
    refused.replaceChildren();
    if (drafts.error) {
      this.drafts = null;
      document.getElementById("pick-plan").textContent = "Cannot read the drafts: " + drafts.error;
      return;
    }
    this.drafts = drafts;
    for (const d of this.drafts.data) {
      const o = new Option(d.accepted ? d.id : `${d.id}: refused (${d.rule})`, d.id);
      o.disabled = !d.accepted;
      o.title = d.message;
      sel.append(o);
      if (!d.accepted) {
        const li = document.createElement("li");
        li.dataset.model = d.id;
        li.textContent = `${d.id}: refused by the ${d.rule} rule: ${d.message}`;
        refused.append(li);
      }
    }
    if (this.loaded && this.loaded.model === model && this.loaded.draft) sel.value = this.loaded.draft;
    this.showPlan();
  },

  showPlan() {
    const out = document.getElementById("pick-plan");
    if (!this.drafts) return;
    const draft = document.getElementById("pick-draft").value;
    const row = draft ? this.drafts.data.find((d) => d.id === draft) : null;
    const p = row ? row.plan : this.drafts.plan;
    const gib = (b) => (b / 2 ** 30).toFixed(2) + " GiB";
    out.textContent = `Memory plan${row ? " for the pair" : ""}: ${gib(p.total)} of ` +
      `${gib(p.available)} available` + (p.fits ? "" : ": does not fit");
    out.classList.toggle("bad", !p.fits);
  },

  async load() {
    const model = document.getElementById("pick-target").value;
    const draft = document.getElementById("pick-draft").value || null;
    const button = document.getElementById("pick-load");
    const status = document.getElementById("pick-status");
    button.disabled = true;
    status.textContent = `Loading ${model}${draft ? " with " + draft : ""}…`;
    try {
      await api("models/load", { method: "POST", body: JSON.stringify({ model, draft }) });
      for (let i = 0; ; i++) { // until the router says loaded (or failed)
        const items = (await (await api("models")).json()).data || [];
        const it = items.find((x) => x.id === model);
        const st = it ? this.status(it) : "unloaded";
        if (st === "loaded") break;
        if (st === "failed") throw new Error(`${model} failed to load`);
        await new Promise((r) => setTimeout(r, 500));
      }
      this.loaded = { model, draft };
      await connect();
      await this.list();
    } catch (e) {
      status.textContent = "Not loaded: " + e.message;
    } finally {
      button.disabled = false;
    }
  },

  say() {
    const status = document.getElementById("pick-status");
    status.textContent = this.loaded
      ? `Answers: ${this.loaded.model}${this.loaded.draft ? ", draft " + this.loaded.draft : ", no draft"}`
      : "No model loaded yet: pick one and Load.";
  },
};
