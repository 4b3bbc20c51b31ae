"""fsspec's reference format, versions 0 and 1, read into one flat table of key -> inline data or target; no I/O.

The table has the shape fsspec's ReferenceFileSystem keeps in memory: a value is inline text
or bytes (`base64:` ones decoded when read, as fsspec does), `[URL]` for a whole file, or
`[URL, OFFSET, SIZE]` for a byte range. Templates and `gen` entries are expanded here, once,
at mount; an entry zarrfs does not understand is refused in one line naming it, never read
as fill. Template expressions are jinja2's (what the format and fsspec use), in its sandbox.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
import types
from typing import Any

import fsspec
from fsspec.registry import known_implementations, registry

from ..errors import UserError

# The fields of a version-1 document and of one of its `gen` entries (fsspec's reference spec).
VERSION1_FIELDS = frozenset(("version", "templates", "gen", "refs"))
GEN_FIELDS = frozenset(("key", "url", "offset", "length", "dimensions"))
RANGE_FIELDS = frozenset(("start", "stop", "step"))
# Keys a `gen` entry may make, in all: a table entry costs a few hundred bytes, so this keeps a
# hostile or mistaken generator (dimensions of 10**12) to about a GiB at mount.
MAX_GENERATED_KEYS = 1 << 22
# What one template expression may produce: a URL, an offset or a length is far shorter; a
# longer result (`{{ 'a' * 10**10 }}`) is an attack on the daemon's memory.
MAX_RENDERED_CHARS = 1 << 16
# What one `*` may repeat a text to, and how large an integer `*` or `**` may make: URLs, offsets
# and lengths are far smaller; `{{ 'a' * 10**10 }}` or `{{ 10**10**10 }}` attack the memory.
MAX_REPEATED_CHARS = 4096
MAX_INTEGER_BITS = 4096
# jinja2's filters that make a value no larger than what they are given.
SAFE_FILTERS = frozenset(("int", "float", "string", "lower", "upper", "abs", "round", "default", "trim", "length"))
# A `{{name}}` placeholder, which needs no template engine.
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# The extra that brings jinja2 (template expressions), named where it is missing.
JINJA_REMEDY = "pip install 'zarrfs[references]'"


def references_table(doc: Any, shown: str) -> dict[str, Any]:
    """The flat table of DOC, a parsed JSON document of fsspec references (version 0 or 1).

    Raises UserError (one line naming the entry) for anything not understood.
    """
    if not isinstance(doc, dict):
        raise UserError(f"{shown}: not fsspec references (not a JSON object)")
    if "version" not in doc:
        return {key: _inline_or_target(key, value, shown) for key, value in doc.items()}
    if doc["version"] != 1:
        raise UserError(f"{shown}: references of version {doc['version']!r}: zarrfs reads versions 0 and 1")
    unknown = sorted(set(doc) - VERSION1_FIELDS)
    if unknown:
        raise UserError(
            f"{shown}: references of version 1 with fields zarrfs does not understand: {', '.join(unknown)}"
        )
    refs = doc.get("refs", {})
    templates = doc.get("templates", {}) or {}
    gens = doc.get("gen", []) or []
    if not isinstance(refs, dict) or not isinstance(templates, dict) or not isinstance(gens, list):
        raise UserError(f"{shown}: references of version 1 need `refs` and `templates` objects and a `gen` list")
    bad = [k for k, v in templates.items() if not isinstance(v, str)]
    if bad:
        raise UserError(f"{shown}: template {bad[0]!r} is not a string")
    render = Renderer(templates, shown)
    table: dict[str, Any] = {}
    for key, value in refs.items():
        value = _inline_or_target(key, value, shown)
        if isinstance(value, list) and "{{" in value[0]:
            value = [render.text(value[0], {}, key), *value[1:]]
        table[key] = value
    for number, gen in enumerate(gens):
        table.update(_generated(gen, number, render, shown))  # as fsspec: generated keys win
    return table


def _inline_or_target(key: Any, value: Any, shown: str) -> Any:
    """VALUE of KEY as the table holds it: inline str / bytes, or a target list; else UserError."""
    if not isinstance(key, str) or not key:
        raise UserError(f"{shown}: reference key {key!r} is not a name")
    if isinstance(value, dict):  # an inline JSON document (fsspec writes it back as text)
        return json.dumps(value)
    if isinstance(value, str):
        if value.startswith("base64:"):
            try:
                base64.b64decode(value[7:], validate=True)
            except (binascii.Error, ValueError):
                raise UserError(f"{shown}: reference {key!r}: its base64: data does not decode") from None
        return value
    if isinstance(value, list) and len(value) in (1, 3) and isinstance(value[0], str) and value[0]:
        if len(value) == 1:
            return [value[0]]
        offset, size = value[1], value[2]
        if _natural(offset) and _natural(size):
            return [value[0], offset, size]
    raise UserError(
        f"{shown}: reference {key!r} is not understood ({json.dumps(value)[:80]}): zarrfs reads inline "
        f"text, base64: data, [URL] and [URL, OFFSET, LENGTH] (fsspec's reference format 0 and 1)"
    )


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _generated(gen: Any, number: int, render: Renderer, shown: str) -> dict[str, list[Any]]:
    """The entries a `gen` entry makes: one per point of its dimensions' product."""
    where = f"{shown}: gen entry {number}"
    if not isinstance(gen, dict) or not {"key", "url", "dimensions"} <= set(gen) or set(gen) - GEN_FIELDS:
        raise UserError(f"{where}: expected the fields key, url, dimensions and optionally offset with length")
    if ("offset" in gen) != ("length" in gen):
        raise UserError(f"{where}: offset and length go together")
    if not all(
        isinstance(gen[f], (str, int)) and not isinstance(gen[f], bool) for f in GEN_FIELDS & set(gen) - {"dimensions"}
    ):
        raise UserError(f"{where}: key, url, offset and length are template strings")
    dimensions = gen["dimensions"]
    if not isinstance(dimensions, dict) or not dimensions:
        raise UserError(f"{where}: dimensions must be an object of names to ranges or lists")
    axes = {name: _axis(name, axis, where) for name, axis in dimensions.items()}
    count = math.prod(len(values) for values in axes.values())
    if count > MAX_GENERATED_KEYS:
        raise UserError(f"{where} makes {count} keys, more than the {MAX_GENERATED_KEYS} zarrfs expands")
    fields = ("key", "url", "offset", "length") if "offset" in gen else ("key", "url")
    compiled = {f: render.compile(str(gen[f]), where, tuple(axes)) for f in fields}
    out: dict[str, list[Any]] = {}
    for point in itertools.product(*axes.values()):
        names = dict(zip(axes, point))
        got = {f: render.run(template, names, where) for f, template in compiled.items()}
        if not got["url"]:
            raise UserError(f"{where}: key {got['key']!r} has an empty url")
        if "offset" not in got:
            out[got["key"]] = [got["url"]]
            continue
        try:
            offset, length = int(got["offset"]), int(got["length"])
        except ValueError:
            raise UserError(
                f"{where}: key {got['key']!r}: offset {got['offset']!r}, length {got['length']!r}"
            ) from None
        if offset < 0 or length < 0:
            raise UserError(f"{where}: key {got['key']!r}: a negative offset or length")
        out[got["key"]] = [got["url"], offset, length]
    return out


def _axis(name: Any, axis: Any, where: str) -> Any:
    """The values of one dimension of a `gen` entry: a list, or a range {start, stop, step}."""
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"{where}: dimension {name!r} is not a name")
    if isinstance(axis, list):
        return axis
    if isinstance(axis, dict) and "stop" in axis and not set(axis) - RANGE_FIELDS:
        bounds = (axis.get("start", 0), axis["stop"], axis.get("step", 1))
        if all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) and bounds[2] != 0:
            return range(*bounds)
    raise UserError(f"{where}: dimension {name!r}: expected a list or {{start, stop, step}} integers")


class Renderer:
    """The templates of a version-1 document, and the expressions that use them.

    `{{name}}` placeholders are replaced as they are; anything else (an expression, a template
    that takes arguments) is rendered by jinja2 in its sandbox, where an undefined name is an
    error rather than an empty string.
    """

    def __init__(self, templates: dict[str, str], shown: str) -> None:
        self.templates = templates
        self.shown = shown
        self._env: Any = None
        self._context: dict[str, Any] | None = None

    def text(self, text: str, names: dict[str, Any], key: str) -> str:
        """TEXT with its templates filled in (a reference's URL)."""
        plain = _placeholders_only(text, self.templates)
        if plain is not None:
            return plain
        return self.run(
            self.compile(text, f"{self.shown}: reference {key!r}"), names, f"{self.shown}: reference {key!r}"
        )

    def compile(self, text: str, where: str, names: tuple[str, ...] = ()) -> Any:
        """TEXT ready to render many times, with NAMES (and the templates) given each time."""
        if "{{" not in text and "{%" not in text:
            return text
        plain = set(names) | {n for n, t in self.templates.items() if "{{" not in t}
        rest = PLACEHOLDER.sub("", text)
        if all(n in plain for n in PLACEHOLDER.findall(text)) and "{{" not in rest and "{%" not in rest:
            return Placeholders(text)  # the text jinja2 would give, without its cost per key
        env = self._environment()
        try:
            return env.from_string(text)
        except Exception as e:  # jinja2's TemplateSyntaxError, or anything its parser raises
            raise UserError(f"{where}: template {text!r} does not parse ({e})") from None

    def run(self, compiled: Any, names: dict[str, Any], where: str) -> str:
        """A compiled template rendered with the document's templates and NAMES."""
        if isinstance(compiled, str):
            return compiled
        if isinstance(compiled, Placeholders):
            return compiled.fill({**self.templates, **names})
        try:
            out = compiled.render(**{**self._templates_context(), **names})
        except Exception as e:  # undefined names, sandbox refusals, errors of the expression
            raise UserError(f"{where}: a template does not render ({type(e).__name__}: {e})") from None
        if len(out) > MAX_RENDERED_CHARS:
            raise UserError(f"{where}: a template renders to {len(out)} characters")
        return out

    def _templates_context(self) -> dict[str, Any]:
        """The templates as jinja sees them: text, or (when it is a template itself) a function of keyword arguments."""
        if self._context is None:
            context: dict[str, Any] = {}
            for name, text in self.templates.items():
                if "{{" in text:
                    compiled = self.compile(text, f"{self.shown}: template {name!r}")
                    where = f"{self.shown}: template {name!r}"
                    context[name] = lambda _t=compiled, _w=where, **kw: self.run(_t, kw, _w)
                else:
                    context[name] = text
            self._context = context
        return self._context

    def _environment(self) -> Any:
        if self._env is None:
            self._env = bounded_sandbox(self.shown)
        return self._env


class Placeholders:
    """A text whose only templates are `{{name}}` placeholders."""

    def __init__(self, text: str) -> None:
        self.text = text

    def fill(self, values: dict[str, Any]) -> str:
        return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), self.text)


def _placeholders_only(text: str, templates: dict[str, str]) -> str | None:
    """TEXT with `{{name}}` placeholders replaced by plain templates, or None when it needs jinja2."""
    found = PLACEHOLDER.findall(text)
    if any(name not in templates or "{{" in templates[name] for name in found):
        return None
    out = PLACEHOLDER.sub(lambda m: templates[m.group(1)], text)
    return None if "{{" in out or "{%" in out else out


def bounded_sandbox(shown: str) -> Any:
    """jinja2's sandbox for the format's expressions: undefined names an error, no statements
    (`{% for %}`), no methods or filters that make large values, `*` and `**` bounded."""
    try:
        import jinja2
        from jinja2.exceptions import SecurityError
        from jinja2.sandbox import SandboxedEnvironment
    except ImportError:
        raise UserError(f"{shown}: template expressions need jinja2: {JINJA_REMEDY}") from None

    class Bounded(SandboxedEnvironment):
        intercepted_binops = frozenset(("*", "**"))

        def is_safe_callable(self, obj: Any) -> bool:
            # The document's own templates and `range`: no str methods (`'a'.center(10**9)`).
            return isinstance(obj, types.FunctionType) and bool(super().is_safe_callable(obj))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if isinstance(left, int) and isinstance(right, int):
                bits = left.bit_length() * right if operator == "**" else left.bit_length() + right.bit_length()
                if bits > MAX_INTEGER_BITS:
                    raise SecurityError("integer too large")
            elif operator == "*":
                sized = left if isinstance(left, (str, list, tuple)) else right
                times = right if sized is left else left
                if isinstance(times, int) and times * len(sized) > MAX_REPEATED_CHARS:
                    raise SecurityError("repetition too large")
            return super().call_binop(context, operator, left, right)

        def _parse(self, source: str, name: Any, filename: Any) -> Any:
            if "{%" in source or "{#" in source:
                raise SecurityError("statements and comments are not expressions")
            return super()._parse(source, name, filename)

    env = Bounded(undefined=jinja2.StrictUndefined)
    env.globals = {"range": env.globals["range"]}
    env.filters = {name: f for name, f in env.filters.items() if name in SAFE_FILTERS}
    return env


def target_problem(url: str, remote_protocol: str | None) -> str | None:
    """Why zarrfs does not read the target URL (one phrase), or None when it can."""
    if "{{" in url or "{%" in url:
        return f"data file {url}: a template with no value"
    if "::" in re.sub(r"\[[0-9A-Fa-f:.]*\]", "", url):  # fsspec's chains; not an IPv6 address
        return f"data file {url}: a chained URL (fsspec's reference file system reads one file system per target)"
    protocol, path = fsspec.core.split_protocol(url)
    if protocol is None and remote_protocol not in (None, "file", "local"):
        return None
    if protocol in (None, "file", "local"):
        if not path.startswith("/"):
            return f"data file {url} is a relative path: make the references with its absolute path or URL"
        return None
    if protocol not in known_implementations and protocol not in registry:
        return f"data file {url}: protocol {protocol!r} is not one fsspec knows"
    return None
