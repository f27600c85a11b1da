"""Tool calls: parsing (malformed, unknown, out of range), argument schemas, zoom and compare golden values,
user tools through the registry."""

from __future__ import annotations

import numpy as np
import pytest

from rl.agent.parse import REASONS, ParseError, ToolCall, is_call, parse_call
from rl.agent.task import AgentTask
from rl.agent.tools import (
    MAX_LISTED_REGIONS,
    TOOLS,
    Observation,
    ToolRegistry,
    box_pixels,
    changed_square,
    default_registry,
    register_tool,
)
from tests.rl.agent_helpers import change_pair


def _parse(body: str, n_images: int = 2, registry: ToolRegistry | None = None):
    return parse_call(
        f"let me look <tool>{body}</tool> trailing", registry or default_registry(), n_images=n_images
    )


def _task(*sources: np.ndarray) -> AgentTask:
    return AgentTask(task_id="t", kind="change", sources=sources, question="q", answer="a")


def test_valid_calls_parse_to_tool_calls():
    zoom = _parse('{"name": "zoom", "image": 2, "box": [0.25, 0, 0.5, 1]}')
    assert zoom == ToolCall("zoom", {"image": 2, "box": [0.25, 0, 0.5, 1]})
    assert _parse('{"images": [2, 1], "name": "compare"}') == ToolCall("compare", {"images": [2, 1]})


@pytest.mark.parametrize(
    "text, reason",
    [
        ('<tool>{"name": "zoom", "image": 1, "box": [0, 0, 1, 1]}', "unclosed"),
        ('<tool>{"name": "zoom", "image": 1, </tool>', "malformed_json"),
        ("<tool>zoom(1)</tool>", "malformed_json"),
        ('<tool>["zoom", 1]</tool>', "not_object"),
        ('<tool>{"tool": "zoom"}</tool>', "no_name"),
        ('<tool>{"name": 3}</tool>', "no_name"),
        ('<tool>{"name": "rotate", "image": 1}</tool>', "unknown_tool"),
        ('<tool>{"name": "zoom", "image": 1}</tool>', "missing_arg"),
        ('<tool>{"name": "zoom", "image": 1, "box": [0, 0, 1, 1], "scale": 2}</tool>', "extra_arg"),
        ('<tool>{"name": "zoom", "image": "1", "box": [0, 0, 1, 1]}</tool>', "bad_type"),
        ('<tool>{"name": "zoom", "image": true, "box": [0, 0, 1, 1]}</tool>', "bad_type"),
        ('<tool>{"name": "zoom", "image": 1.0, "box": [0, 0, 1, 1]}</tool>', "bad_type"),
        ('<tool>{"name": "zoom", "image": 1, "box": [0, 0, "1", 1]}</tool>', "bad_type"),
        ('<tool>{"name": "zoom", "image": 1, "box": [0, 0, 1]}</tool>', "bad_value"),
        ('<tool>{"name": "zoom", "image": 3, "box": [0, 0, 1, 1]}</tool>', "image_out_of_range"),
        ('<tool>{"name": "zoom", "image": 0, "box": [0, 0, 1, 1]}</tool>', "image_out_of_range"),
        ('<tool>{"name": "compare", "images": [1, 3]}</tool>', "image_out_of_range"),
        ('<tool>{"name": "compare", "images": [2, 2]}</tool>', "bad_value"),
        ('<tool>{"name": "compare", "images": [1]}</tool>', "bad_value"),
        ('<tool>{"name": "zoom", "image": 1, "box": [0.5, 0, 0.5, 1]}</tool>', "bad_box"),
        ('<tool>{"name": "zoom", "image": 1, "box": [0.6, 0, 0.5, 1]}</tool>', "bad_box"),
        ('<tool>{"name": "zoom", "image": 1, "box": [0, 0, 1.2, 1]}</tool>', "bad_box"),
        ('<tool>{"name": "zoom", "image": 1, "box": [-0.1, 0, 1, 1]}</tool>', "bad_box"),
    ],
)
def test_bad_calls_give_a_reason_and_an_error_observation(text, reason):
    out = parse_call(text, default_registry(), n_images=2)
    assert isinstance(out, ParseError) and out.reason == reason
    assert out.observation.startswith("error: ") and len(out.observation) > 12


def test_messages_say_what_was_expected():
    out = _parse('{"name": "zoom", "image": 3, "box": [0, 0, 1, 1]}')
    assert out.message == "image=3 but the note has images 1..2"
    out = _parse('{"name": "rotate"}')
    assert out.message == "unknown tool 'rotate'; tools: zoom, compare"
    out = _parse('{"name": "zoom", "image": 1}')
    assert out.message == "missing argument(s) ['box']; expected ['box', 'image']"


def test_the_first_call_of_a_turn_is_parsed():
    text = '<tool>{"name": "compare", "images": [1, 2]}</tool> <tool>{"name": "zoom"}</tool>'
    assert parse_call(text, default_registry(), n_images=2) == ToolCall("compare", {"images": [1, 2]})
    assert is_call(text) and not is_call("the cup is red")


def test_parse_error_rejects_unknown_reasons():
    with pytest.raises(ValueError, match="unknown parse error reason"):
        ParseError("oops", "x")
    assert "unclosed" in REASONS


def test_box_pixels_cover_the_box_and_never_empty():
    assert box_pixels([0.1, 0.1, 0.2, 0.3], 80, 40) == (8, 4, 16, 12)
    assert box_pixels([0.0, 0.0, 1.0, 1.0], 80, 40) == (0, 0, 80, 40)
    assert box_pixels([0.999, 0.999, 1.0, 1.0], 80, 40) == (79, 39, 80, 40)
    assert box_pixels([0.101, 0.5, 0.102, 0.5001], 80, 40) == (8, 20, 9, 21)


def test_zoom_crops_the_full_resolution_source():
    a, b = change_pair()
    out = default_registry().run(ToolCall("zoom", {"image": 2, "box": [0.1, 0.1, 0.2, 0.3]}), _task(a, b))
    assert out.text == "zoom of image 2 at [0.10, 0.10, 0.20, 0.30] (8x8 px of the source):"
    assert out.image.shape == (8, 8, 3) and out.image.dtype == np.uint8
    assert bool((out.image == np.array([255, 0, 0], dtype=np.uint8)).all())
    assert out.image.flags["C_CONTIGUOUS"]


def test_compare_lists_changed_regions_largest_first_in_zoom_coordinates():
    a, b = change_pair()
    registry = default_registry()
    out = registry.run(ToolCall("compare", {"images": [1, 2]}), _task(a, b))
    assert out.text == "2 regions changed: [0.75, 0.50, 0.95, 0.90] [0.10, 0.10, 0.20, 0.30]"
    assert out.image is None
    same = registry.run(ToolCall("compare", {"images": [1, 2]}), _task(a, a.copy()))
    assert same.text == "no change between image 1 and image 2"
    small = registry.run(ToolCall("compare", {"images": [1, 2]}), _task(a, a[:20]))
    assert small.text == (
        "error: images 1 and 2 differ in size (80x40 vs 80x20: other shapes, so not one view); "
        "compare needs two photos of one view"
    )


def test_compare_takes_one_view_at_two_sizes():
    """A photo and a resized copy of its view (a messenger's, with another filter and JPEG noise): the change
    is found where it is, as fractions of either photo, and the zoom cuts each photo at its own size."""
    import io

    from PIL import Image

    from tests.imgdiff.photos import photo

    big = np.ascontiguousarray(photo("astronaut")[:480, :400])  # (480, 400, 3)
    small = np.asarray(Image.fromarray(big).resize((200, 240), Image.LANCZOS)).copy()
    small[100:120, 50:70] = [255, 0, 0]  # x 50..69, y 100..119 of 200 x 240
    buf = io.BytesIO()
    Image.fromarray(small).save(buf, "JPEG", quality=90)
    small = np.asarray(Image.open(buf).convert("RGB")).copy()
    registry = default_registry()
    for order in ([1, 2], [2, 1]):
        out = registry.run(ToolCall("compare", {"images": order, "zoom": True}), _task(big, small))
        assert out.text.startswith("1 region changed: [0.25, 0.42, 0.35, 0.50];"), out.text
        crops = dict(zip(order, out.images))
        assert crops[1].shape[0] == 2 * crops[2].shape[0] and crops[1].shape[1] == 2 * crops[2].shape[1]
        red = (crops[2][..., 0] > 200) & (crops[2][..., 1] < 60)
        assert red.sum() > 300  # the changed patch is in the small photo's crop
    skewed = registry.run(ToolCall("compare", {"images": [1, 2]}), _task(big, small[:, :190]))
    assert skewed.text.startswith("error: images 1 and 2 differ in size (400x480 vs 190x240: other shapes")


def test_compare_with_zoom_shows_the_changed_area_of_both_images():
    a, b = change_pair()  # changed: [8, 4, 15, 11] and [60, 20, 75, 35] inclusive, in an 80x40 photo
    out = default_registry().run(ToolCall("compare", {"images": [2, 1], "zoom": True}), _task(a, b))
    # the square around both regions, padded 3 px: x 5..79 (75 wide) cannot be 75 tall in 40 px rows,
    # so the side is 40, centred on x 42 and moved into the photo
    assert changed_square([(8, 4, 15, 11), (60, 20, 75, 35)], 80, 40) == (22, 0, 62, 40)
    assert out.text == (
        "2 regions changed: [0.75, 0.50, 0.95, 0.90] [0.10, 0.10, 0.20, 0.30]; "
        "image 2 then image 1 at [0.28, 0.00, 0.78, 1.00]:"
    )
    assert len(out.images) == 2 and out.image is out.images[0]
    np.testing.assert_array_equal(out.images[0], b[0:40, 22:62])  # image 2 first, as asked
    np.testing.assert_array_equal(out.images[1], a[0:40, 22:62])
    assert all(im.flags["C_CONTIGUOUS"] for im in out.images)
    one = changed_square([(8, 4, 15, 11)], 80, 40)  # 8x8 region + 3 px each side = 14 px square
    assert one == (5, 1, 19, 15)
    assert changed_square([(0, 0, 1, 1)], 80, 40) == (0, 0, 8, 8)  # 2x2 at the corner: moved in, not cut
    same = default_registry().run(ToolCall("compare", {"images": [1, 2], "zoom": True}), _task(a, a.copy()))
    assert same.text == "no change between image 1 and image 2" and same.images == ()


def test_compare_caps_the_listed_regions():
    a = np.zeros((40, 800, 3), dtype=np.uint8)
    b = a.copy()
    for k in range(10):
        b[10:20, 80 * k + 2 : 80 * k + 8] = 255
    out = default_registry().run(ToolCall("compare", {"images": [1, 2]}), _task(a, b))
    assert out.text.startswith("10 regions changed: ")
    assert out.text.endswith(f"(+{10 - MAX_LISTED_REGIONS} smaller)")
    assert out.text.count("[") == MAX_LISTED_REGIONS


def test_user_tool_is_validated_and_run():
    registry = default_registry()

    def brightness(task, image, channel):
        return f"mean {channel} = {task.sources[image - 1][..., 'rgb'.index(channel)].mean():.1f}"

    schema = {
        "type": "object",
        "properties": {
            "image": {"type": "integer", "x-image": True},
            "channel": {"enum": ["r", "g", "b"], "type": "string"},
        },
        "required": ["image", "channel"],
    }
    register_tool("brightness", brightness, schema, description="mean of a channel", registry=registry)
    assert "brightness" in registry and "brightness" not in TOOLS
    assert "brightness(image, channel): mean of a channel" in registry.describe()
    a, b = change_pair()
    call = _parse('{"name": "brightness", "image": 2, "channel": "r"}', registry=registry)
    assert call == ToolCall("brightness", {"image": 2, "channel": "r"})
    assert (
        registry.run(call, _task(a, b)).text == "mean r = 120.3"
    )  # (128 * 2880 + 255 * 64 + 0 * 256) / 3200
    bad = _parse('{"name": "brightness", "image": 2, "channel": "x"}', registry=registry)
    assert bad.reason == "bad_value" and "['r', 'g', 'b']" in bad.message


def test_a_failing_tool_gives_an_error_observation():
    registry = ToolRegistry()

    def broken(task):
        raise RuntimeError("disk on fire")

    registry.register("broken", broken, {"type": "object", "properties": {}})
    out = registry.run(ToolCall("broken", {}), _task(*change_pair()))
    assert out == Observation("error: broken failed: RuntimeError: disk on fire")


@pytest.mark.parametrize(
    "schema, match",
    [
        ({"type": "array"}, 'must be a dict with "type": "object"'),
        ({"type": "object", "properties": {"x": {"type": "integer"}}, "oneOf": []}, "unsupported keys"),
        ({"type": "object", "properties": {"x": {"type": "tuple"}}}, "needs a type"),
        ({"type": "object", "properties": {"x": {"type": "integer", "format": "int32"}}}, "unsupported keys"),
        ({"type": "object", "properties": {"x": {"type": "array"}}}, "needs an items schema"),
        ({"type": "object", "properties": {"x": {"type": "string", "x-image": True}}}, "x-image marks"),
        ({"type": "object", "properties": {"name": {"type": "string"}}}, "reserved"),
        ({"type": "object", "properties": {}, "required": ["x"]}, r"required \['x'\]"),
    ],
)
def test_bad_schemas_are_rejected_at_registration(schema, match):
    with pytest.raises(ValueError, match=match):
        ToolRegistry().register("t", lambda task: "", schema)


def test_registry_rejects_duplicates_and_bad_names():
    registry = default_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("zoom", lambda task: "", {"type": "object"})
    with pytest.raises(ValueError, match="identifier"):
        registry.register("my tool", lambda task: "", {"type": "object"})
    with pytest.raises(TypeError, match="callable"):
        registry.register("t", "not a function", {"type": "object"})


def test_additional_properties_allows_extra_arguments():
    registry = ToolRegistry()
    registry.register(
        "echo", lambda task, **kw: str(sorted(kw)), {"type": "object", "additionalProperties": True}
    )
    assert parse_call('<tool>{"name": "echo", "a": 1}</tool>', registry, n_images=1) == ToolCall(
        "echo", {"a": 1}
    )
