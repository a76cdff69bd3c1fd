// node --test tests/web/: which widgets are greyed out under which choice.
import assert from "node:assert/strict";
import { test } from "node:test";

import { greyable, ignoredWidgets, olderThan, settable } from "../../web/js/ignored.js";

test("the model's sampling defaults grey out the sampling widgets", () => {
  const decode = (sampling) => [...ignoredWidgets("SJDVP_SpeculativeDecode", { sampling })].sort();
  assert.deepEqual(decode("model defaults"), ["cfg", "image_cfg", "temperature", "top_k", "top_p"]);
  assert.deepEqual(decode("custom"), []);
});

test("VP's strength under auto, tree_auto without window_auto", () => {
  assert.deepEqual([...ignoredWidgets("SJDVP_VerificationPrediction", { strength_mode: "auto" })], ["strength"]);
  assert.equal(ignoredWidgets("SJDVP_VerificationPrediction", { strength_mode: "fixed" }).size, 0);
  assert.deepEqual([...ignoredWidgets("SJDVP_JacobiWindow", { window_auto: false })], ["tree_auto"]);
  assert.equal(ignoredWidgets("SJDVP_JacobiWindow", { window_auto: true }).size, 0);
  assert.equal(ignoredWidgets("SaveImage", {}).size, 0);
});

test("Tokens to Image ignores the DiT's steps and guidance where the model's pixels come from a VQ decoder", () => {
  const image = (pixels) => [...ignoredWidgets("SJDVP_DecodeImage", { "@pixels": pixels })].sort();
  assert.deepEqual(image("vq"), ["guidance", "steps"]);
  assert.deepEqual(image("dit"), []);
  assert.deepEqual(image(undefined), []);       // the graph does not say: nothing greyed
  assert.deepEqual([...greyable("SJDVP_DecodeImage")].sort(), ["guidance", "steps"]);
  assert.deepEqual([...greyable("SJDVP_SpeculativeDecode")].sort(), ["cfg", "image_cfg", "temperature", "top_k", "top_p"]);
  assert.equal(greyable("SaveImage").size, 0);
});

test("a property defined as a getter only is not settable (frontends 1.41 to 1.52's control widgets)", () => {
  class Widget {
    #state = { disabled: false };
    get disabled() { return this.#state.disabled; }
    set disabled(v) { this.#state.disabled = v; }
  }
  const plain = new Widget();
  const control = new Widget();
  Object.defineProperty(control, "disabled", { get: () => true });     // as those frontends do
  assert.equal(settable(plain, "disabled"), true);
  assert.equal(settable(control, "disabled"), false);
  assert.throws(() => { "use strict"; control.disabled = false; }, TypeError);   // what broke every load
  assert.equal(settable({}, "disabled"), true);
  assert.equal(settable(Object.freeze({}), "disabled"), false);
  assert.equal(settable(Object.freeze({ disabled: 1 }), "disabled"), false);
});

test("frontend versions compare part by part", () => {
  assert.equal(olderThan("1.31.2", "1.32.9"), true);
  assert.equal(olderThan("1.32.9", "1.32.9"), false);
  assert.equal(olderThan("1.100.0", "1.32.9"), false);    // not as strings
  assert.equal(olderThan("1.4", "1.32.9"), true);
});
