"""A small strict schema for inventory mappings: known keys only, typed, with defaults and docs.

Every problem is collected (not raised one at a time) with the path of the variable, so that one run of
preflight lists everything wrong with an inventory, each line naming the variable and the fix.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_MISSING = object()
MAX_INT = 2 ** 53  # integers beyond it are not exact as JSON numbers or floats: no inventory number may be


def number_problem(v: Any) -> str | None:
    """The one rule for every number of an inventory: finite, and exact (|v| <= 2**53). bool is not a number."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v!r} is not a finite number; write a number"
    if abs(v) > MAX_INT:
        return f"{v if isinstance(v, float) else str(v)[:20] + '...'} is beyond 2**53; write a smaller number"
    return None


def numbers_problems(value: Any, path: str, problems: list[str]) -> None:
    """number_problem for every number inside `value` (mappings and lists walked), each named by its path."""
    if isinstance(value, dict):
        for k, v in value.items():
            numbers_problems(v, f"{path}.{k}", problems)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            numbers_problems(v, f"{path}[{i}]", problems)
    elif msg := number_problem(value):
        problems.append(f"{path}: {msg}")


def as_number(text: str) -> int | float | None:
    """The number a quoted text spells ("30001", "1.5"), or None."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its type(s), default, allowed values and a one-line doc (units included)."""

    types: tuple[type, ...]
    doc: str
    default: Any = _MISSING
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text, or None when fine
    schema: Schema | None = None  # for nested mappings
    item_schema: Schema | None = None  # for lists of mappings

    @property
    def required(self) -> bool:
        return self.default is _MISSING


@dataclass(frozen=True)
class Schema:
    name: str
    fields: dict[str, Field] = field(default_factory=dict)

    def validate(self, value: Any, path: str, problems: list[str]) -> dict[str, Any]:
        """Return `value` with defaults filled in; append one message per problem to `problems`."""
        if value is None:
            value = {}
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping ({self.name}), got {type(value).__name__} {value!r}")
            return {}
        out: dict[str, Any] = {}
        for key in value:
            if key not in self.fields:
                hint = difflib.get_close_matches(str(key), self.fields, n=1)
                fix = f"did you mean '{hint[0]}'?" if hint else f"known keys: {', '.join(sorted(self.fields))}"
                problems.append(f"{path}.{key}: unknown key in {self.name}; {fix}")
        for key, f in self.fields.items():
            out[key] = validate_field(f, value.get(key), f"{path}.{key}" if path else key, problems, key in value)
        return out


def validate_field(f: Field, value: Any, path: str, problems: list[str], present: bool = True) -> Any:
    """Validate one value against its Field; `present=False` means the key was not set at all."""
    if present and value is None and type(None) not in f.types:
        # `key:` with nothing after it (or every line under it commented out) is not "defaults apply"
        problems.append(f"{path}: is empty (null); remove the key or give it a value ({f.doc}); if you meant the "
                        "word null, quote it")
        return None
    if not present:
        if f.required:
            problems.append(f"{path}: required ({f.doc}); set it in the inventory")
            return None
        v = f.default() if callable(f.default) else f.default
        return _fill(f, v, path, problems) if v is not None else None
    return _fill(f, value, path, problems)


def _fill(f: Field, v: Any, path: str, problems: list[str]) -> Any:
    if isinstance(v, bool) and bool not in f.types:
        hint = "; if you meant the word, quote it (\"off\", \"no\"): unquoted YAML reads it as a boolean" \
            if str in f.types else ""
        problems.append(f"{path}: expected {_names(f.types)}, got boolean {v!r}{hint}")
        return v
    if msg := number_problem(v):
        problems.append(f"{path}: {msg}")
        return v
    if not isinstance(v, f.types):
        if float in f.types and isinstance(v, int):
            v = float(v)
        elif isinstance(v, str) and (int in f.types or float in f.types) and as_number(v.strip()) is not None:
            problems.append(f"{path}: expected {_names(f.types)}, got the string {v!r}; write it without quotes "
                            f"({path.rsplit('.', 1)[-1]}: {v.strip()}), so that every check sees the number")
            return v
        else:
            problems.append(f"{path}: expected {_names(f.types)}, got {type(v).__name__} {v!r}")
            return v
    if f.choices is not None and v not in f.choices:
        problems.append(f"{path}: {v!r} is not one of {', '.join(map(repr, f.choices))}")
    if f.schema is not None:
        v = f.schema.validate(v, path, problems)
    if f.item_schema is not None:
        v = [f.item_schema.validate(item, f"{path}[{i}]", problems) for i, item in enumerate(v)]
    if f.check is not None and (msg := f.check(v)):
        problems.append(f"{path}: {msg}")
    return v


def _names(types: tuple[type, ...]) -> str:
    return " or ".join({dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
                        bool: "boolean", type(None): "null"}.get(t, t.__name__) for t in types)


def plain(value: Any) -> Any:
    """Ansible's tagged dicts/lists/strings -> plain Python containers (JSON-able)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if type(value).__name__ == "EncryptedString":  # an inline !vault value: Ansible decrypts it with the loader's
        return str(value._decrypt())  # secrets (load/vault.py) when it is read, as a play would
    return value


def describe(schema: Schema, prefix: str = "") -> list[tuple[str, str, str]]:
    """(path, type, doc) for every key, nested included: used to generate docs and argument_specs checks."""
    rows = []
    for key, f in schema.fields.items():
        p = f"{prefix}{key}"
        default = "required" if f.required else repr(f.default)
        rows.append((p, _names(f.types), f"{f.doc} (default: {default})"))
        if f.schema is not None:
            rows.extend(describe(f.schema, p + "."))
        if f.item_schema is not None:
            rows.extend(describe(f.item_schema, p + "[]."))
    return rows


def jsonschema_module():
    """The jsonschema package, imported without `rfc3987_syntax`. jsonschema/_format.py imports that module, where it
    is installed (here: cyclonedx-python-lib's validation extra, the SBOM tool), to check the `iri` and
    `iri-reference` formats, and it builds a Lark grammar at import: 1.7 s of `import jsonschema`'s 2.25 s on a
    2-core machine (`python -X importtime -c 'import jsonschema'`). pdstack never checks formats (no
    FormatChecker is passed), so those two checkers are not needed; the import is blocked only while jsonschema
    first loads (its `from rfc3987_syntax import ...` then raises ImportError, which it catches)."""
    import sys

    if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
        try:
            import jsonschema
        finally:
            del sys.modules["rfc3987_syntax"]
    import jsonschema

    return jsonschema
