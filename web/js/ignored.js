// Widgets that the node ignores under another widget's current choice, greyed out while it holds (so an
// artist does not tune a value that does nothing). Pure data and functions, tested with node --test.

// node type -> the choosing widget -> its value -> the widgets that value makes the node ignore. A chooser
// starting with "@" is no widget but a fact of the graph that the extension reads (sjdvp.js):
// "@pixels" is where the connected model's pixels come from, "dit" (GLM-Image) or "vq" (every other family).
export const IGNORED = {
  SJDVP_SpeculativeDecode: { sampling: { "model defaults": ["cfg", "temperature", "top_k", "top_p", "image_cfg"] } },
  SJDVP_VerificationPrediction: { strength_mode: { auto: ["strength"] } },
  SJDVP_JacobiWindow: { window_auto: { false: ["tree_auto"] } },
  SJDVP_DecodeImage: { "@pixels": { vq: ["steps", "guidance"] } },
};

// values: {widget name or graph fact: value}; -> the names of the widgets ignored now.
export function ignoredWidgets(nodeType, values) {
  const out = new Set();
  for (const [chooser, byValue] of Object.entries(IGNORED[nodeType] ?? {})) {
    for (const name of byValue[String(values[chooser])] ?? []) out.add(name);
  }
  return out;
}

// The widgets this node type may grey out: the only ones the extension ever touches.
export function greyable(nodeType) {
  return new Set(Object.values(IGNORED[nodeType] ?? {}).flatMap((byValue) => Object.values(byValue).flat()));
}

// Whether obj.key can be assigned: frontends 1.41 to 1.52 define some widgets' `disabled` as a getter
// only (seed's control_after_generate), and an assignment to it throws in a module.
export function settable(obj, key) {
  for (let o = obj; o; o = Object.getPrototypeOf(o)) {
    const d = Object.getOwnPropertyDescriptor(o, key);
    if (d) return "value" in d ? !!d.writable : !!d.set;
  }
  return Object.isExtensible(obj);
}

// Whether version a ("1.41.21") comes before version b, part by part.
export function olderThan(a, b) {
  const [x, y] = [a, b].map((v) => String(v).split(".").map((n) => parseInt(n, 10) || 0));
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) < (y[i] ?? 0);
  }
  return false;
}
