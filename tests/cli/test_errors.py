"""The error hierarchy drawn in dossier/errors.py's docstring is the class tree."""

from __future__ import annotations

import inspect
import re

from dossier import errors


def drawn_parents(doc: str) -> dict[str, str]:
    """Class name -> the name drawn as its parent, from the tree's box-drawing indentation."""
    lines = doc.split("Hierarchy::", 1)[1].split("\n\n", 2)[1].splitlines()
    root = lines[0].strip()
    stack: list[tuple[int, str]] = [(-1, root)]
    out: dict[str, str] = {}
    for line in lines[1:]:
        m = re.search(r"── (\w+)", line)
        assert m is not None, line
        depth = m.start()
        while stack[-1][0] >= depth:
            stack.pop()
        out[m.group(1)] = stack[-1][1]
        stack.append((depth, m.group(1)))
    return out


def test_the_detector_reads_a_tree() -> None:
    doc = ("Hierarchy::\n\n    A\n    ├── B    x\n    │   └── C    y\n    └── D\n\nmore\n")
    assert drawn_parents(doc) == {"B": "A", "C": "B", "D": "A"}


def test_the_drawn_tree_is_the_class_tree() -> None:
    assert errors.__doc__ is not None
    drawn = drawn_parents(errors.__doc__)
    classes = {name: cls for name, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, errors.DossierError) and cls is not errors.DossierError}
    assert set(drawn) == set(classes), set(drawn) ^ set(classes)
    wrong = {name: (drawn[name], cls.__bases__[0].__name__) for name, cls in classes.items()
             if drawn[name] != cls.__bases__[0].__name__}
    assert wrong == {}, wrong  # name: (drawn parent, real parent)
