// The speed-up badge's text, from the figures Speculative Decode and Speed-up Report send to the UI
// (their `sjdvp_report` output: sjdvp_core.report.report_data). Pure functions, tested with node --test.

// message: the node's UI output ({text: [...], sjdvp_report: [{step_compression, tokens_per_pass, ...}]}).
export function reportOf(message) {
  const data = message?.sjdvp_report;
  return Array.isArray(data) && data.length ? data[0] : null;
}

export function badgeText(report) {
  const figure = report?.step_compression;
  if (typeof figure !== "number" || !Number.isFinite(figure)) return null;
  const parts = [`${figure.toFixed(2)}× fewer passes`];
  if (typeof report.tokens_per_pass === "number") parts.push(`${report.tokens_per_pass.toFixed(1)} tok/pass`);
  return parts.join(" · ");
}

// The report text as core's "Preview as Text" joins it.
export function reportText(message) {
  const text = message?.text;
  return Array.isArray(text) ? text.join("\n\n") : (text ?? "");
}
