// Widgets added after the first release take, in workflows saved before them, the value that keeps
// the workflow's old meaning (the nodes' execute() defaults do the same for API prompts).
import { LEGACY } from "./legacy_values.js";

export { LEGACY };

// widgetNames: the node's widgets in order; saved: how many values the workflow stored.
export function legacyValues(nodeType, widgetNames, saved) {
  const legacy = LEGACY[nodeType] ?? {};
  const out = {};
  widgetNames.forEach((name, i) => {
    if (i >= saved && name in legacy) out[name] = legacy[name];
  });
  return out;
}
