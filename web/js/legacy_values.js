// Written by tools/make_workflows.py from nodes/legacy.py: do not edit.
export const LEGACY = {
  "SJDVP_DrafterSJD": {
    "coupled": false
  },
  "SJDVP_DrafterLANTERN": {
    "coupled": false
  },
  "SJDVP_DrafterGSD": {
    "coupled": false
  },
  "SJDVP_VerificationPrediction": {
    "strength_mode": "fixed"
  },
  "SJDVP_SpeculativeDecode": {
    "width": 0,
    "height": 0,
    "sampling": "custom",
    "compile": false,
    "method": "AR"
  },
  "SJDVP_JacobiWindow": {
    "tree_width": 1,
    "tree_depth": 1,
    "window_auto": false,
    "tree_auto": false
  },
  "SJDVP_DecodeImage": {
    "steps": 50,
    "guidance": 1.5
  }
};
