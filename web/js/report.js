// Reads the speed-up figures out of a Speculative Decode / Speed-up Report text (sjdvp_core/report.py),
// for the badge the sjdvp extension draws on those nodes. Pure functions, tested with node --test.

export function parseReport(text) {
  const number = (re) => {
    const m = text.match(re);
    return m ? Number(m[1]) : null;
  };
  return {
    speedup: number(/([\d.]+)x fewer steps/),
    tokensPerPass: number(/tokens per pass: mean ([\d.]+)/),
    acceptance: number(/drafts accepted ([\d.]+)%/),
  };
}

export function badgeText(report) {
  if (report.speedup === null) return null;
  const parts = [`${report.speedup.toFixed(2)}× fewer passes`];
  if (report.tokensPerPass !== null) parts.push(`${report.tokensPerPass.toFixed(1)} tok/pass`);
  return parts.join(" · ");
}
