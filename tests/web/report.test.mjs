// node --test tests/web/: the badge figures read from a real report's wording.
import assert from "node:assert/strict";
import { test } from "node:test";
import { readFileSync } from "node:fs";

import { badgeText, parseReport } from "../../web/js/report.js";

const REPORT = readFileSync(process.env.SJDVP_REPORT, "utf8");   // written by tests/test_web.py

test("reads the speed-up, tokens per pass and acceptance", () => {
  const r = parseReport(REPORT);
  assert.ok(r.speedup > 1 && r.tokensPerPass >= 1 && r.acceptance > 0 && r.acceptance <= 100);
  assert.match(badgeText(r), /^\d+\.\d\d× fewer passes · \d+\.\d tok\/pass$/);
});

test("no figure, no badge", () => {
  assert.equal(badgeText(parseReport("")), null);
});
