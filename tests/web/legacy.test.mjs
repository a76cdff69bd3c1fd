// node --test tests/web/: workflows saved before a widget existed keep their old meaning.
import assert from "node:assert/strict";
import { test } from "node:test";

import { legacyValues } from "../../web/js/legacy.js";

test("widgets beyond the saved values get their legacy value", () => {
  const vp = ["growth_steps", "beta", "top_k", "strength", "max_score", "strength_mode"];
  assert.deepEqual(legacyValues("SJDVP_VerificationPrediction", vp, 5), { strength_mode: "fixed" });
  assert.deepEqual(legacyValues("SJDVP_VerificationPrediction", vp, 6), {});
  assert.deepEqual(legacyValues("SJDVP_DrafterSJD", ["coupled"], 0), { coupled: false });
  assert.deepEqual(legacyValues("SJDVP_DrafterGSD", ["group", "max_gap", "max_distance", "coupled"], 4), {});
  assert.deepEqual(legacyValues("SJDVP_SpeculativeDecode", ["prompt"], 0), {});
  const decode = ["prompt", "negative_prompt", "cfg", "temperature", "top_k", "top_p", "seed", "batch_size",
    "width", "height", "sampling"];
  assert.deepEqual(legacyValues("SJDVP_SpeculativeDecode", decode, 10), { sampling: "custom" });
  assert.deepEqual(legacyValues("SJDVP_SpeculativeDecode", decode, 11), {});
});
