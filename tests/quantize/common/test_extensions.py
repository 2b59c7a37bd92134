"""The one extension mechanism: `_target_` names a class, build() returns its typed config."""
from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from quantize.common.errors import UserError
from quantize.common.extensions import Configurable, build


class Shape(Configurable):
    """A stand-in extension point."""


@dataclass
class Square(Shape):
    side: float
    colour: str = "red"

    def area(self) -> float:
        return self.side ** 2


class NotAShape:
    pass


HERE = __name__


def test_build_returns_the_typed_object_from_a_dictconfig():
    square = build(OmegaConf.create({"_target_": f"{HERE}.Square", "side": 3}), Shape, "conf/shape/sq.yaml")
    assert isinstance(square, Square) and square.area() == 9 and square.colour == "red"


@pytest.mark.parametrize("values,message", [
    ({"side": 1}, "names no implementation; add `_target_: <module>.<Class>`"),
    ({"_target_": "no_such_module_xyz.Square"}, "cannot import module 'no_such_module_xyz'"),
    ({"_target_": f"{HERE}.Circle"}, f"{HERE}.Circle does not exist"),
    ({"_target_": f"{HERE}.NotAShape"}, "is not a subclass of"),
    ({"_target_": f"{HERE}.Square", "sid": 1}, "'sid' is not a setting of Square; did you mean side?"),
    ({"_target_": f"{HERE}.Square"}, "Square needs side; add it to the YAML"),
    ({"_target_": f"{HERE}.Square", "side": "abc"}, "side=abc is not a number; pass a number for side"),
    ({"_target_": f"{HERE}.Square", "side": True}, "side=true is not a number"),
])
def test_each_mistake_is_one_line_naming_the_file(values, message):
    with pytest.raises(UserError) as e:
        build(values, Shape, "conf/shape/sq.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "conf/shape/sq.yaml" in str(e.value)


@dataclass
class Settings(Shape):
    count: int
    share: float | None = None
    enabled: bool = True
    label: list | str = "a"   # not only scalars: not checked
    title: str = "t"
    tags: list[str] = field(default_factory=list)   # a list, of text
    name: str = "s"


@pytest.mark.parametrize("values", [
    {"count": 3}, {"count": 3, "share": 2}, {"count": 3, "share": None, "enabled": False}, {"count": 3, "label": 5},
    {"count": 3, "title": "", "tags": ["a", "b"], "name": "mine"},
])
def test_scalar_fields_take_their_types(values):
    assert build({"_target_": f"{HERE}.Settings", **values}, Shape, "conf/shape/s.yaml").count == 3


@pytest.mark.parametrize("given, read", [(1, True), (0, False), (True, True)])
def test_a_true_or_false_field_reads_1_and_0_as_the_top_level_switches_do(given, read):
    # settings.flag takes force=0; sanity.enabled=0 was refused with "is not true or false"
    built = build({"_target_": f"{HERE}.Settings", "count": 3, "enabled": given}, Shape, "conf/shape/s.yaml")
    assert built.enabled is read


@pytest.mark.parametrize("values, message", [
    ({"count": "abc"}, "count=abc is not an integer"),
    ({"count": 2.5}, "count=2.5 is not an integer"),
    ({"count": None}, "count=null is not an integer"),
    ({"count": 3, "title": 2}, "title=2 is not text"),           # Hydra reads title=2 as a number
    ({"count": 3, "title": ["a"]}, r"title=\['a'\] is not text"),
    ({"count": 3, "name": " "}, "name is empty"),
    ({"count": 3, "share": "half"}, "share=half is not a number"),
    ({"count": 3, "enabled": "no"}, "enabled=no is not true or false"),   # bool("no") is True
    ({"count": 3, "enabled": 2}, "enabled=2 is not true or false"),
])
def test_a_scalar_field_of_another_type_is_one_line(values, message):
    with pytest.raises(UserError, match=f"^conf/shape/s.yaml: {message}; pass "):
        build({"_target_": f"{HERE}.Settings", **values}, Shape, "conf/shape/s.yaml")
