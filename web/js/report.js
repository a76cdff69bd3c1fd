// The speed-up badge's text, from the figures Speculative Decode and Speed-up Report send to the UI
// (their `sjdvp_report` output: sjdvp_core.report.report_data). Pure functions, tested with node --test.

// message: the node's UI output ({text: [...], sjdvp_report: [{step_compression, tokens_per_pass, ...}]}).
export function reportOf(message) {
  const data = message?.sjdvp_report;
  return Array.isArray(data) && data.length ? data[0] : null;
}

// Time first: the estimated wall-clock speed-up on this device and the seconds it saved (priced by the
// device's measured pass cost), then the passes and tokens per pass behind it, and how the passes ran.
export function badgeText(report) {
  const figure = report?.step_compression;
  if (typeof figure !== "number" || !Number.isFinite(figure)) return null;
  const parts = [];
  const estimate = report.estimated_speedup;
  if (typeof estimate === "number" && Number.isFinite(estimate)) {
    const saved = report.estimated_seconds_saved;
    const faster = estimate >= 1;          // slower (a window too wide for the device): said so, never "0.80× faster"
    const seconds = typeof saved === "number" && Number.isFinite(saved)
      ? `, ${Math.abs(saved).toFixed(1)} s ${faster ? "saved" : "lost"}` : "";
    const ratio = faster ? estimate : 1 / estimate;
    parts.push(`~${ratio.toFixed(2)}× ${faster ? "faster" : "slower"} (est.${seconds})`);
  }
  parts.push(`${figure.toFixed(2)}× fewer passes`);
  if (typeof report.tokens_per_pass === "number") parts.push(`${report.tokens_per_pass.toFixed(1)} tok/pass`);
  if (report.passes === "captured" || report.passes === "eager") parts.push(report.passes);   // the report says why
  return parts.join(" · ");
}

// The report text as core's "Preview as Text" joins it.
export function reportText(message) {
  const text = message?.text;
  return Array.isArray(text) ? text.join("\n\n") : (text ?? "");
}

// A key of the frontend's node outputs -> the node, in the root graph given: a locator id ("8"; inside a
// subgraph "<subgraph uuid>:8") or, in frontend 1.32's per-workflow store, an execution id ("12:8": the
// subgraph node's id on the way down, then the node's own).
export function nodeForOutputKey(root, key) {
  const parts = String(key).split(":");
  const id = parts.pop();
  let graph = root;
  if (parts.length === 1 && root?.subgraphs?.get?.(parts[0])) graph = root.subgraphs.get(parts[0]);
  else for (const part of parts) graph = graph?.getNodeById?.(part)?.subgraph;
  return graph?.getNodeById?.(id) ?? null;
}
