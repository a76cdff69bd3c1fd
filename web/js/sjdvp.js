// Two small helps: a speed-up badge on Speculative Decode and Speed-up Report nodes after they run
// ("3.30× fewer passes · 3.4 tok/pass", read from the report text the nodes send to the UI; drawing
// only, no widget added), and old workflows keeping their meaning when a node gained a widget.
import { app } from "../../scripts/app.js";
import { LEGACY, legacyValues } from "./legacy.js";
import { badgeText, parseReport } from "./report.js";

const NODES = new Set(["SJDVP_SpeculativeDecode", "SJDVP_Report"]);

app.registerExtension({
  name: "sjdvp.SpeedBadge",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name in LEGACY) {
      const onConfigure = nodeType.prototype.onConfigure;
      nodeType.prototype.onConfigure = function (info) {
        onConfigure?.apply(this, arguments);
        const names = (this.widgets ?? []).map((w) => w.name);
        const values = legacyValues(nodeData.name, names, info?.widgets_values?.length ?? names.length);
        for (const w of this.widgets ?? []) if (w.name in values) w.value = values[w.name];
      };
    }
    if (!NODES.has(nodeData.name)) return;

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const text = (message?.text ?? []).join("\n");
      this.sjdvpBadge = badgeText(parseReport(text));
      this.setDirtyCanvas(true, false);
    };

    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      if (!this.sjdvpBadge || this.flags?.collapsed) return;
      const titleHeight = globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
      ctx.save();
      ctx.font = "bold 11px sans-serif";
      const width = ctx.measureText(this.sjdvpBadge).width + 14;
      const x = this.size[0] - width - 6;
      const y = -titleHeight + 6;
      ctx.fillStyle = "#1f7a4d";
      ctx.beginPath();
      ctx.roundRect(x, y, width, titleHeight - 12, 8);
      ctx.fill();
      ctx.fillStyle = "#ffffff";
      ctx.textBaseline = "middle";
      ctx.fillText(this.sjdvpBadge, x + 7, y + (titleHeight - 12) / 2);
      ctx.restore();
    };
  },
});
