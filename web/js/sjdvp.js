// Two small helps: what a run found, shown where the artist looks; widgets that the node's current
// choices (or the model connected to it) make it ignore greyed out. None of them may ever break a frontend's loading of a workflow.
//  - Speed-up Report shows its report text on the node (a read-only text box, as core's "Preview as
//    Text" does), and Speculative Decode and Speed-up Report carry a badge ("~X× faster (est., S s saved)
//    · Y× fewer passes · T tok/pass · captured") built from the figures the nodes send as data
//    (`sjdvp_report`). The classic canvas draws it as a litegraph node badge. The Vue node renderer
//    ("Nodes 2.0") reads node badges once when it mounts a node (frontend 1.58: measured), so after a run
//    it gets a chip in the node's header instead.
//  - Both come back when ComfyUI replays a cached run (the nodes are output nodes, so it re-sends their
//    UI output) and when the frontend restores outputs itself (a tab reopened, a queue entry loaded).
import { api } from "../../../scripts/api.js";
import { app } from "../../../scripts/app.js";
import { IGNORED, greyable, ignoredWidgets, olderThan, settable } from "./ignored.js";
import { badgeText, nodeForOutputKey, reportOf, reportText } from "./report.js";

const NODES = new Set(["SJDVP_SpeculativeDecode", "SJDVP_Report"]);
const OLDEST_FRONTEND = "1.32.9";       // the oldest frontend tested (docs/frontends.md; pyproject.toml's floor)
const REPORT_BOX = "report";
const BADGE_COLOURS = { fgColor: "#ffffff", bgColor: "#1f7a4d" };

function vueNodes() {
  return !!app.extensionManager?.setting?.get?.("Comfy.VueNodes.Enabled");
}

// A read-only, unsaved text box (never part of the prompt or of widgets_values).
function addReportBox(node) {
  const widgets = window.comfyAPI?.widgets?.ComfyWidgets;
  if (!widgets?.STRING) return;
  const { widget } = widgets.STRING(node, REPORT_BOX, ["STRING", { multiline: true }], app);
  widget.serialize = false;
  widget.options ??= {};
  widget.options.serialize = false;
  widget.options.read_only = true;
  if (widget.element) {
    widget.element.readOnly = true;
    widget.element.placeholder = "the speed-up report appears here after a run";
  }
}

function showBadge(node, text) {
  node.sjdvpBadge = text;
  const LGraphBadge = globalThis.LGraphBadge;
  if (LGraphBadge && !node.sjdvpBadgeAdded) {
    node.sjdvpBadgeAdded = true;
    node.badges ??= [];
    node.badges.push(() => new LGraphBadge({ text: vueNodes() ? "" : node.sjdvpBadge ?? "", ...BADGE_COLOURS }));
  }
  node.setDirtyCanvas?.(true, true);
  if (vueNodes()) for (const ms of [0, 100, 500, 1500]) setTimeout(() => headerChip(node), ms);
}

// The Vue renderer's node header: [data-node-id] > [data-testid=node-title] (frontends 1.32 to 1.58).
function headerChip(node) {
  const root = document.querySelector(`[data-node-id="${node.id}"]`);
  const title = root?.querySelector('[data-testid="node-title"]');
  if (!title) return;
  let chip = root.querySelector(".sjdvp-badge");
  if (!node.sjdvpBadge || !vueNodes()) {
    chip?.remove();
    return;
  }
  if (!chip) {
    chip = document.createElement("span");
    chip.className = "sjdvp-badge";
    Object.assign(chip.style, {
      background: BADGE_COLOURS.bgColor, color: BADGE_COLOURS.fgColor, borderRadius: "8px", padding: "1px 7px",
      font: "bold 11px sans-serif", whiteSpace: "nowrap", marginLeft: "4px", flexShrink: "0",
    });
    title.after(chip);
  }
  chip.textContent = node.sjdvpBadge;
}

// What a node shows, from its UI output: an "executed" message (a run, or ComfyUI replaying a cached
// output node's output) or outputs the frontend put back itself.
function applyOutput(node, message) {
  if (!message) return;
  const box = node.widgets?.find((w) => w.name === REPORT_BOX);
  if (box) box.value = reportText(message);
  showBadge(node, badgeText(reportOf(message)));
}

// Where the pixels of the tokens reaching this node come from ("dit" or "vq"), read along its links to
// the Load model node; undefined where the graph does not say (an unlinked input, a node between we do
// not know, a model name the server did not list), and then nothing is greyed for it.
let pixelSources = null;         // {model choice: "dit" | "vq"}, from the server's /sjdvp/pixels

const refreshPixelSources = guarded("reading the models' pixel sources", async () => {
  const response = await api.fetchApi("/sjdvp/pixels");
  pixelSources = response.ok ? await response.json() : null;
  greyAll();
});

// The node feeding `input`, past legacy Reroute nodes; null where none does, or where the node is in no graph
// yet (created, not added: frontends 1.55+ throw NullGraphError from getInputNode then).
function upstream(node, input) {
  const slot = node.inputs?.findIndex((i) => i.name === input) ?? -1;
  let from = slot >= 0 && node.graph ? node.getInputNode?.(slot) : null;
  while (from?.type === "Reroute" && from.graph) from = from.getInputNode?.(0);
  return from ?? null;
}

function pixelsOf(node) {
  const loader = upstream(upstream(node, "tokens") ?? {}, "model");
  const model = loader?.type === "SJDVP_LoadModel" ? loader.widgets?.find((w) => w.name === "model")?.value : undefined;
  return pixelSources?.[model];
}

// Grey out the widgets the node ignores under its current choices (ignored.js). Only those widgets are
// touched, and only through properties the frontend lets us set: where it has no way to show it, nothing.
function greyIgnored(node) {
  const type = node.type ?? node.comfyClass;
  const values = Object.fromEntries((node.widgets ?? []).map((w) => [w.name, w.value]));
  values["@pixels"] = pixelsOf(node);
  const ignored = ignoredWidgets(type, values);
  const names = greyable(type);
  for (const w of node.widgets ?? []) {
    if (!names.has(w.name)) continue;
    const off = ignored.has(w.name);
    if (settable(w, "disabled")) w.disabled = off;               // the classic canvas (litegraph's computedDisabled)
    w.options ??= {};
    if (settable(w.options, "disabled")) w.options.disabled = off;  // the Vue node renderer's widget components
  }
  node.updateComputedDisabled?.();
  node.setDirtyCanvas?.(true, true);
}

function greyAll() {
  for (const node of app.graph?._nodes ?? []) if ((node.type ?? node.comfyClass) in IGNORED) greyIgnored(node);
}

// A choosing widget's change greys its own node again; a model chosen on a loader may change what the
// Tokens to Image nodes below it ignore, so that greys every node again.
function watchChoices(node) {
  const type = node.type ?? node.comfyClass;
  const choosers = type === "SJDVP_LoadModel" ? ["model"] : Object.keys(IGNORED[type] ?? {});
  for (const w of node.widgets ?? []) {
    if (!choosers.includes(w.name) || w.sjdvpWatched) continue;
    w.sjdvpWatched = true;
    const callback = w.callback;
    w.callback = function () {
      const r = callback?.apply(this, arguments);
      guarded("greying out ignored widgets", type === "SJDVP_LoadModel" ? greyAll : () => greyIgnored(node))();
      return r;
    };
  }
  if (type in IGNORED) greyIgnored(node);
}

// Our hooks never break the frontend: an error in one (a frontend that changed under us) is logged once
// and swallowed, since a throw inside a node's onConfigure aborts the loading of the whole workflow.
const logged = new Set();
function guarded(what, fn) {
  const report = (e) => {
    if (logged.has(what)) return;
    logged.add(what);
    console.error(`sjdvp: ${what} failed and was skipped (the workflow is unaffected):`, e);
  };
  return function (...args) {
    try {
      const r = fn.apply(this, args);
      return r instanceof Promise ? r.catch(report) : r;
    } catch (e) {
      report(e);
    }
  };
}

// Runs fn(node, ...args) after the node type's own `method` (ComfyUI's, and other extensions' before ours).
function after(nodeType, method, what, fn) {
  const own = nodeType.prototype[method];
  const ours = guarded(what, fn);
  nodeType.prototype[method] = function (...args) {
    const r = own?.apply(this, args);
    ours(this, ...args);
    return r;
  };
}

// One console line where the frontend is older than any we test: the nodes run, the canvas extras may not show.
function sayIfUntested() {
  const version = window.__COMFYUI_FRONTEND_VERSION__;
  if (version && olderThan(version, OLDEST_FRONTEND)) {
    console.warn(`sjdvp: ComfyUI frontend ${version} is older than ${OLDEST_FRONTEND}, the oldest tested: the nodes ` +
      "run, but the speed badge, report box and greyed-out widgets may not show. Update ComfyUI to get them.");
  }
}

app.registerExtension({
  name: "sjdvp.SpeedBadge",
  setup() {
    guarded("checking the frontend's version", sayIfUntested)();
    refreshPixelSources();        // not awaited: the app does not wait for it
  },
  // A workflow loaded: its links are all in place only now (a node's onConfigure may run before its inputs').
  afterConfigureGraph: guarded("greying out ignored widgets", greyAll),
  // The model lists refreshed (the R key): models may have arrived or left.
  refreshComboInNodes: () => refreshPixelSources(),
  // Outputs put back without an "executed" message (a workflow tab opened again, a queue or history
  // entry loaded): frontends 1.32 to 1.58 assign app.nodeOutputs and call this hook, never onExecuted.
  onNodeOutputsUpdated: guarded("showing a report", (outputs) => {
    for (const [key, output] of Object.entries(outputs ?? {})) {
      const node = nodeForOutputKey(app.rootGraph ?? app.graph, key);
      if (node && NODES.has(node.type)) applyOutput(node, output);
    }
  }),
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name in IGNORED || nodeData.name === "SJDVP_LoadModel") {
      after(nodeType, "onNodeCreated", "greying out ignored widgets", watchChoices);
      after(nodeType, "onConfigure", "greying out ignored widgets", watchChoices);
      after(nodeType, "onConnectionsChange", "greying out ignored widgets", greyAll);
    }
    if (!NODES.has(nodeData.name)) return;
    if (nodeData.name === "SJDVP_Report") after(nodeType, "onNodeCreated", "adding the report box", addReportBox);
    after(nodeType, "onExecuted", "showing a report", applyOutput);
  },
});
