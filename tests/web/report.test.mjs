// node --test tests/web/: the badge and the report box from what the nodes really send to the UI.
import assert from "node:assert/strict";
import { test } from "node:test";
import { readFileSync } from "node:fs";

import { badgeText, nodeForOutputKey, reportOf, reportText } from "../../web/js/report.js";

// a Speed-up Report node's UI output (nodes/decode_nodes.py report_ui), written by tests/nodes/test_web.py
const MESSAGE = JSON.parse(readFileSync(process.env.SJDVP_REPORT, "utf8"));

test("the badge comes from the figures the node sends", () => {
  const r = reportOf(MESSAGE);
  assert.ok(r.step_compression > 1 && r.tokens_per_pass >= 1 && r.acceptance > 0 && r.acceptance <= 1);
  // time first: the estimated speed-up and seconds saved, then passes and tokens per pass
  assert.match(badgeText(r), /^~\d+\.\d\d× (faster|slower) \(est\., \d+\.\d s (saved|lost)\) · \d+\.\d\d× fewer passes · \d+\.\d tok\/pass · eager$/);
  const ratio = r.estimated_speedup >= 1 ? r.estimated_speedup : 1 / r.estimated_speedup;
  assert.ok(badgeText(r).startsWith(`~${ratio.toFixed(2)}`));
  assert.ok(badgeText(r).includes(Math.abs(r.estimated_seconds_saved).toFixed(1)));
  assert.equal(badgeText({ step_compression: 2, tokens_per_pass: 2 }), "2.00× fewer passes · 2.0 tok/pass");   // no estimate
  assert.equal(badgeText({ step_compression: 2, tokens_per_pass: 2, estimated_speedup: 0.8, estimated_seconds_saved: -0.5 }),
    "~1.25× slower (est., 0.5 s lost) · 2.00× fewer passes · 2.0 tok/pass");      // a window too wide for the device
  assert.equal(badgeText({ step_compression: 2, tokens_per_pass: 2, passes: "captured" }),
    "2.00× fewer passes · 2.0 tok/pass · captured");                               // the pass replayed as CUDA graphs
});

test("the report box shows the report text", () => {
  assert.match(reportText(MESSAGE), /forward passes/);
});

test("no figures, no badge", () => {
  assert.equal(reportOf({ text: ["old server"] }), null);
  assert.equal(badgeText(null), null);
  assert.equal(badgeText({ step_compression: Number.NaN }), null);
});

test("an output key finds its node: locator ids, subgraph locators, execution ids", () => {
  const graph = (nodes, subgraphs) => ({
    getNodeById: (id) => nodes[String(id)] ?? null, subgraphs: new Map(Object.entries(subgraphs ?? {})),
  });
  const inner = { type: "SJDVP_Report" };
  const sub = graph({ 8: inner });
  const root = graph({ 3: { type: "SJDVP_SpeculativeDecode" }, 12: { type: "subgraph", subgraph: sub } },
    { "5d0c-uuid": sub });
  assert.equal(nodeForOutputKey(root, "3").type, "SJDVP_SpeculativeDecode");
  assert.equal(nodeForOutputKey(root, 3).type, "SJDVP_SpeculativeDecode");
  assert.equal(nodeForOutputKey(root, "5d0c-uuid:8"), inner);     // a locator id inside a subgraph
  assert.equal(nodeForOutputKey(root, "12:8"), inner);            // an execution id (frontend 1.32)
  assert.equal(nodeForOutputKey(root, "99"), null);
  assert.equal(nodeForOutputKey(root, "7:8"), null);
});
