// Widgets that the node ignores under another widget's current choice, greyed out while it holds (so an
// artist does not tune a value that does nothing). Pure data and one function, tested with node --test.

// node type -> the choosing widget -> its value -> the widgets that value makes the node ignore
export const IGNORED = {
  SJDVP_SpeculativeDecode: { sampling: { "model defaults": ["cfg", "temperature", "top_k", "top_p"] } },
  SJDVP_VerificationPrediction: { strength_mode: { auto: ["strength"] } },
  SJDVP_JacobiWindow: { window_auto: { false: ["tree_auto"] } },
};

// values: {widget name: value}; -> the names of the widgets ignored now.
export function ignoredWidgets(nodeType, values) {
  const out = new Set();
  for (const [chooser, byValue] of Object.entries(IGNORED[nodeType] ?? {})) {
    for (const name of byValue[String(values[chooser])] ?? []) out.add(name);
  }
  return out;
}
