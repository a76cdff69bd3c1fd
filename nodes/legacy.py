"""What widgets added after the first release mean in prompts and workflows saved before them: the
value their absence meant then. execute() takes these as its defaults (API prompts), and the web
extension fills them into old UI workflows (web/js/legacy_values.js, written from this table by
tools/make_workflows.py; a test keeps the two equal). Plain data: no ComfyUI import."""

LEGACY = {
    "SJDVP_DrafterSJD": {"coupled": False},
    "SJDVP_DrafterLANTERN": {"coupled": False},
    "SJDVP_DrafterGSD": {"coupled": False},
    "SJDVP_VerificationPrediction": {"strength_mode": "fixed"},
    "SJDVP_SpeculativeDecode": {"width": 0, "height": 0, "sampling": "custom", "compile": False, "method": "AR"},
    "SJDVP_JacobiWindow": {"tree_width": 1, "tree_depth": 1, "window_auto": False, "tree_auto": False},
    # the DiT's settings (GLM-Image; VQ decoders ignore them): upstream's defaults, as the widgets' own
    "SJDVP_DecodeImage": {"steps": 50, "guidance": 1.5},
}
