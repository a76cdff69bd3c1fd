// node --test tests/web/: which widgets are greyed out under which choice.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ignoredWidgets } from "../../web/js/ignored.js";

test("the model's sampling defaults grey out the four sampling widgets", () => {
  const decode = (sampling) => [...ignoredWidgets("SJDVP_SpeculativeDecode", { sampling })].sort();
  assert.deepEqual(decode("model defaults"), ["cfg", "temperature", "top_k", "top_p"]);
  assert.deepEqual(decode("custom"), []);
});

test("VP's strength under auto, tree_auto without window_auto", () => {
  assert.deepEqual([...ignoredWidgets("SJDVP_VerificationPrediction", { strength_mode: "auto" })], ["strength"]);
  assert.equal(ignoredWidgets("SJDVP_VerificationPrediction", { strength_mode: "fixed" }).size, 0);
  assert.deepEqual([...ignoredWidgets("SJDVP_JacobiWindow", { window_auto: false })], ["tree_auto"]);
  assert.equal(ignoredWidgets("SJDVP_JacobiWindow", { window_auto: true }).size, 0);
  assert.equal(ignoredWidgets("SaveImage", {}).size, 0);
});
