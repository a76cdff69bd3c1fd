"""UI-format workflows against a server's node definitions (/object_info): validation (node types
exist, links type-check, widget counts match) and conversion to the API ("prompt") format, as the
frontend's "Export (API)" does."""

from __future__ import annotations

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
# the frontend's own nodes: never sent to the server, not in /object_info
VIRTUAL = {
    "Note",
    "MarkdownNote",
}


def inputs_in_order(info: dict) -> list[tuple[str, object, dict]]:
    """A node's inputs as (name, type, options), required first, in declaration order."""
    out = []
    order = info.get("input_order", {})
    for group in ("required", "optional"):
        specs = info.get("input", {}).get(group, {})
        for name in order.get(group, list(specs)):
            spec = specs[name]
            out.append((name, spec[0], spec[1] if len(spec) > 1 else {}))
    return out


def is_widget(kind) -> bool:
    return isinstance(kind, list) or kind in WIDGET_TYPES


def widget_slots(info: dict) -> list[tuple[str, bool]]:
    """(input name, is it followed by a value of the frontend's own: a control_after_generate mode,
    or an image_upload button's) for each widget."""
    return [
        (name, bool(opts.get("control_after_generate") or opts.get("image_upload")))
        for name, kind, opts in inputs_in_order(info)
        if is_widget(kind)
    ]


def validate(workflow: dict, object_info: dict) -> list[str]:
    problems = []
    nodes = {n["id"]: n for n in workflow["nodes"]}
    for node in workflow["nodes"]:
        if node["type"] in VIRTUAL:
            continue
        info = object_info.get(node["type"])
        if info is None:
            problems.append(f"node {node['id']}: unknown type {node['type']}")
            continue
        expected = sum(1 + extra for _, extra in widget_slots(info))
        if len(node.get("widgets_values", [])) != expected:
            problems.append(
                f"node {node['id']} ({node['type']}): {len(node.get('widgets_values', []))} widget "
                f"values, the node has {expected}"
            )
        sockets = {name: kind for name, kind, _ in inputs_in_order(info) if not is_widget(kind)}
        for inp in node.get("inputs", []):
            if inp["name"] not in sockets:
                problems.append(f"node {node['id']}: no input named {inp['name']}")
    for link_id, src, src_slot, dst, dst_slot, kind in workflow["links"]:
        if src not in nodes or dst not in nodes:
            problems.append(f"link {link_id}: dangling")
            continue
        src_info = object_info.get(nodes[src]["type"], {})
        outputs = src_info.get("output", [])
        if src_slot >= len(outputs) or outputs[src_slot] != kind:
            problems.append(
                f"link {link_id}: output {src_slot} of {nodes[src]['type']} is not {kind}"
            )
        target = nodes[dst]["inputs"][dst_slot]
        sockets = {
            name: k for name, k, _ in inputs_in_order(object_info.get(nodes[dst]["type"], {}))
        }
        if sockets.get(target["name"]) != kind:
            problems.append(
                f"link {link_id}: input {target['name']} of {nodes[dst]['type']} does not take {kind}"
            )
    return problems


def to_api(workflow: dict, object_info: dict) -> dict:
    """UI format -> API format (muted and bypassed nodes, and the frontend's own, left out)."""
    links = {link[0]: link for link in workflow["links"]}
    prompt = {}
    for node in workflow["nodes"]:
        if node.get("mode", 0) != 0 or node["type"] in VIRTUAL:
            continue
        info = object_info[node["type"]]
        inputs, values = {}, list(node.get("widgets_values", []))
        for name, extra in widget_slots(info):
            # saved before this widget existed: the node's default keeps the old meaning
            if not values:
                break
            inputs[name] = values.pop(0)
            if extra:
                values.pop(
                    0
                    # the control_after_generate mode ("fixed", "randomize", ...) or the upload button
                )
        for inp in node.get("inputs", []):
            if inp.get("link") is not None:
                _, src, src_slot, *_ = links[inp["link"]]
                inputs[inp["name"]] = [str(src), src_slot]
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
