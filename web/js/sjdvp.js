// Three small helps: what a run found, shown where the artist looks; old workflows keeping their
// meaning when a node gained a widget; widgets that the node's current choices ignore greyed out.
//  - Speed-up Report shows its report text on the node (a read-only text box, as core's "Preview as
//    Text" does), and Speculative Decode and Speed-up Report carry a badge ("~X× faster (est., S s saved)
//    · Y× fewer passes · T tok/pass") built from the figures the nodes send as data (`sjdvp_report`). The classic
//    canvas draws it as a litegraph node badge. The Vue node renderer ("Nodes 2.0") reads node badges
//    once when it mounts a node (frontend 1.58: measured), so after a run it gets a chip in the node's
//    header instead.
//  - Both come back when ComfyUI replays a cached run (the nodes are output nodes, so it re-sends their
//    UI output) and when the frontend restores outputs itself (a tab reopened, a queue entry loaded).
import { app } from "../../../scripts/app.js";
import { IGNORED, ignoredWidgets } from "./ignored.js";
import { LEGACY, legacyValues } from "./legacy.js";
import { badgeText, nodeForOutputKey, reportOf, reportText } from "./report.js";

const NODES = new Set(["SJDVP_SpeculativeDecode", "SJDVP_Report"]);
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

// Grey out the widgets the node ignores under its current choices (ignored.js), and again whenever a
// choosing widget changes.
function greyIgnored(node) {
  const values = Object.fromEntries((node.widgets ?? []).map((w) => [w.name, w.value]));
  const ignored = ignoredWidgets(node.type ?? node.comfyClass, values);
  for (const w of node.widgets ?? []) {
    if (!(w.name in values)) continue;
    w.disabled = ignored.has(w.name);          // the classic canvas (litegraph's computedDisabled)
    w.options ??= {};
    w.options.disabled = w.disabled;           // the Vue node renderer's widget components
  }
  node.updateComputedDisabled?.();
  node.setDirtyCanvas?.(true, true);
}

function watchChoices(node) {
  for (const w of node.widgets ?? []) {
    if (!(w.name in IGNORED[node.type ?? node.comfyClass]) || w.sjdvpWatched) continue;
    w.sjdvpWatched = true;
    const callback = w.callback;
    w.callback = function () {
      const r = callback?.apply(this, arguments);
      greyIgnored(node);
      return r;
    };
  }
  greyIgnored(node);
}

// Runs fn(node, ...args) after the node type's own `method` (ComfyUI's, and other extensions' before ours).
function after(nodeType, method, fn) {
  const own = nodeType.prototype[method];
  nodeType.prototype[method] = function (...args) {
    const r = own?.apply(this, args);
    fn(this, ...args);
    return r;
  };
}

app.registerExtension({
  name: "sjdvp.SpeedBadge",
  // Outputs put back without an "executed" message (a workflow tab opened again, a queue or history
  // entry loaded): frontends 1.32 to 1.58 assign app.nodeOutputs and call this hook, never onExecuted.
  onNodeOutputsUpdated(outputs) {
    for (const [key, output] of Object.entries(outputs ?? {})) {
      const node = nodeForOutputKey(app.rootGraph ?? app.graph, key);
      if (node && NODES.has(node.type)) applyOutput(node, output);
    }
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name in LEGACY) {
      after(nodeType, "onConfigure", (node, info) => {
        const names = (node.widgets ?? []).map((w) => w.name);
        const values = legacyValues(nodeData.name, names, info?.widgets_values?.length ?? names.length);
        for (const w of node.widgets ?? []) if (w.name in values) w.value = values[w.name];
      });
    }
    if (nodeData.name in IGNORED) {      // after the legacy values: they may change a choice
      after(nodeType, "onNodeCreated", watchChoices);
      after(nodeType, "onConfigure", greyIgnored);
    }
    if (!NODES.has(nodeData.name)) return;
    if (nodeData.name === "SJDVP_Report") after(nodeType, "onNodeCreated", addReportBox);
    after(nodeType, "onExecuted", applyOutput);
  },
});
