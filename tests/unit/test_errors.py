"""Errors declared by their ``class`` line: the public codes, names, labels and
whether each closes the connection are what docs/protocol.md's table says."""

from __future__ import annotations

from pathlib import Path

from tenantkv import errors


def _table() -> dict[int, list[str]]:
    text = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


def test_every_server_error_is_declared_as_the_table_says() -> None:
    table = _table()
    assert set(table) == set(errors.error_classes())
    for code, cls in errors.error_classes().items():
        _, name, labels, closes, _ = table[code]
        assert cls.code == code and name == f"`{cls.code_name}`" == f"`{cls.__name__}`"
        assert closes == ("yes" if cls.fatal else "no"), cls.code_name
        if cls.default_labels:
            assert labels == ", ".join(cls.default_labels), cls.code_name
        else:
            assert labels.startswith("—"), cls.code_name


def test_the_class_line_sets_code_labels_and_fatal_and_the_rest_is_inherited() -> None:
    class Base(errors.ServerError, code=990, labels=(errors.RETRYABLE,), fatal=True):
        pass

    class Derived(Base, code=991):
        pass

    class Named(errors.ServerError, code=992):
        code_name = "AnOlderName"

    assert (Base.code, Base.code_name, Base.default_labels, Base.fatal) == (
        990,
        "Base",
        (errors.RETRYABLE,),
        True,
    )
    assert (Derived.code, Derived.code_name, Derived.default_labels, Derived.fatal) == (
        991,
        "Derived",
        (errors.RETRYABLE,),
        True,
    )
    assert (Named.code_name, Named.fatal, Named.default_labels) == ("AnOlderName", False, ())
    wire = Derived("no").to_wire()
    assert wire == {
        "code": 991,
        "codeName": "Derived",
        "errmsg": "no",
        "errorLabels": [errors.RETRYABLE],
    }
    # Declared inside a test, they stay out of the module's table of codes.
    assert 990 not in errors.error_classes()
