"""What an installed Python package can print, read from its source as text and never imported (SGLang's import
takes seconds): each string and f-string of its modules as a template.

An f-string's value becomes the text the source names for it where it names any (a constant, either branch of a
conditional, what a local or module variable is assigned, a string passed by keyword to the attribute's name, the
strings of a dict it indexes); anything else stands for any text. `%s` and `{name}` in a plain string stand for
any text too (logging and str.format fill them in).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeAlias

# A template's parts: literal text, alternatives (each a list of parts), or ANY (text the source computes).
ANY = None
Part: TypeAlias = "str | tuple[Parts, ...] | None"
Parts: TypeAlias = "list[Part]"
Scope: TypeAlias = "dict[str, list[ast.expr]]"
Body: TypeAlias = "ast.Module | ast.FunctionDef | ast.AsyncFunctionDef"  # where names are assigned

# Where source text can print a word: at the start of a string, or right after an f-string's value; where a call
# passes a keyword; where a module assigns a constant. Indexed once, so that only the modules that can matter are
# parsed, and only the strings that can matter are followed (parsing all of SGLang's takes half a minute).
_QUOTED = re.compile(r"""(?<!["'])["']([A-Za-z][A-Za-z_]*)""")  # not a docstring's third quote
_QUOTED_TWO = re.compile(r"""(?<!["'])["']([A-Za-z][A-Za-z_]* [A-Za-z][A-Za-z_]*)""")
_AFTER_VALUE = re.compile(r"\}\s?([A-Za-z][A-Za-z_]{3,})")
_KEYWORD = re.compile(r"[(,]\s*(\w+)=[^=]")
_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]+)\s*(?::[^=\n]*)?=", re.MULTILINE)
WORD = re.compile(r"[A-Za-z][A-Za-z_]+")
_PLACEHOLDER = re.compile(r"%(?:\(\w+\))?[-#0 +]*\d*(?:\.\d+)?[sdifrxXeEgG]|\{[\w.]*(?:![rsa])?(?::[^{}]*)?\}")
MIN_LITERAL = 8  # a template with less literal text than this (`f"{a}: {b}"`) would match nearly any line
MAX_DEPTH = 5  # how far a value is followed through the variables it is assigned from
MAX_CHOICES = 16  # a value given more texts than this stands for any text
MAX_KEYWORD_FILES = 10  # an attribute whose name many modules pass by keyword (`device=`) stands for any text
SAMPLE_FILLER = "1"  # what ANY becomes in a sample line (a number, a word and a name alike)


class Template:
    """One string of the source: where it is, and (followed on demand) the texts it can be."""

    def __init__(self, source: Source, node: ast.expr, scopes: list[Body], where: str, text: str) -> None:
        self.source, self.node, self.scopes, self.where, self.text = source, node, scopes, where, text

    @cached_property
    def parts(self) -> Parts:
        return _tidy(self.source.resolve(self.node, self.scopes, 0))

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(_regex(self.parts), re.DOTALL)

    @property
    def specific(self) -> bool:
        return _literal(self.parts) >= MIN_LITERAL

    def prints(self, text: str) -> bool:
        """Whether it can print exactly `text`: its fixed text in order first (cheap), then its whole pattern."""
        at = 0
        for i, part in enumerate(self.parts):
            if isinstance(part, str):
                found = text.find(part, at)
                if found < 0 or (i == 0 and found != 0):
                    return False
                at = found + len(part)
        return self.specific and self.regex.fullmatch(text) is not None

    def samples(self, limit: int = 256) -> list[str]:
        """Lines it can print, ANY filled with SAMPLE_FILLER; at most `limit` of its alternatives' combinations."""
        return list(itertools.islice(_expand(self.parts), limit)) if self.specific else []


def _regex(parts: Parts) -> str:
    pieces = []
    for part in parts:
        if part is ANY:
            pieces.append(".*?")
        elif isinstance(part, str):
            pieces.append(re.escape(part))
        else:
            pieces.append("(?:" + "|".join(_regex(choice) for choice in part) + ")")
    return "".join(pieces)


def _expand(parts: Parts) -> Iterator[str]:
    if not parts:
        yield ""
        return
    head, rest = parts[0], parts[1:]
    heads = [SAMPLE_FILLER] if head is ANY else [head] if isinstance(head, str) else head
    for first in heads:
        for before in [first] if isinstance(first, str) else _expand(first):
            for after in _expand(rest):
                yield before + after


def _literal(parts: Parts) -> int:
    """The least literal text a line of these parts has."""
    total = 0
    for part in parts:
        if isinstance(part, str):
            total += len(part)
        elif part is not ANY:
            total += min(_literal(choice) for choice in part)
    return total


def _tidy(parts: Parts) -> Parts:
    """Neighbouring texts joined, neighbouring ANYs one, empty texts gone (fewer steps for the pattern)."""
    tidy: Parts = []
    for part in parts:
        if part == "" or (part is ANY and tidy and tidy[-1] is ANY):
            continue
        if isinstance(part, str) and tidy and isinstance(tidy[-1], str):
            tidy[-1] += part
        else:
            tidy.append(part)
    return tidy


def _plain(text: str) -> Parts:
    """A plain string's parts: its %s and {name} placeholders stand for any text."""
    parts: Parts = []
    at = 0
    for placeholder in _PLACEHOLDER.finditer(text):
        parts += [text[at : placeholder.start()], ANY]
        at = placeholder.end()
    return [*parts, text[at:]]


def _assignments(body: list[ast.stmt]) -> Scope:
    """Each name this body assigns, with every value it is given (nested functions and classes aside)."""
    found: Scope = {}
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.setdefault(node.target.id, []).append(node.value)
        todo += ast.iter_child_nodes(node)
    return found


def _is_text(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_text(node.left)
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _head(node: ast.expr) -> str:
    """The fixed text a string of the source begins with ("" when it begins with a value)."""
    if isinstance(node, ast.BinOp):
        return _head(node.left)
    if isinstance(node, ast.JoinedStr):
        first = node.values[0] if node.values else None
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
    value = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
    placeholder = _PLACEHOLDER.search(value)
    return value[: placeholder.start()] if placeholder else value


def _table_values(node: ast.expr) -> list[ast.expr]:
    """The strings a dict literal (or `defaultdict(lambda: ..., {...})`) holds, its default's among them."""
    if isinstance(node, ast.Dict):
        return [value for value in node.values if value is not None and _is_text(value)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "defaultdict":
        default = [node.args[0].body] if node.args and isinstance(node.args[0], ast.Lambda) else []
        return [*default, *(v for arg in node.args[1:] for v in _table_values(arg))]
    return []


@dataclass
class Source:
    """The modules of one installed package (folders named in `skip` left out)."""

    root: Path
    skip: tuple[str, ...] = ()
    texts: dict[Path, str] = field(init=False)
    _index: dict[re.Pattern[str], dict[str, set[Path]]] = field(init=False, default_factory=dict)
    _trees: dict[Path, ast.Module | None] = field(init=False, default_factory=dict)
    _templates: dict[Path, list[Template]] = field(init=False, default_factory=dict)
    _keyword_values: dict[Path, dict[str, list[ast.expr]]] = field(init=False, default_factory=dict)
    _passed: dict[str, list[ast.expr]] = field(init=False, default_factory=dict)
    _scopes: dict[int, Scope] = field(init=False, default_factory=dict)  # by id() of its body, which the trees keep

    def __post_init__(self) -> None:
        self.texts = {
            path: path.read_text(errors="replace")
            for path in sorted(self.root.rglob("*.py"))
            if not set(path.relative_to(self.root).parts[:-1]) & set(self.skip)
        }
        for pattern in (_QUOTED, _QUOTED_TWO, _AFTER_VALUE, _KEYWORD, _CONSTANT):
            index: dict[str, set[Path]] = self._index.setdefault(pattern, {})
            for path, text in self.texts.items():
                for word in set(pattern.findall(text)):
                    index.setdefault(word, set()).add(path)

    def printing(self, line: str) -> Template | None:
        """A template that prints exactly `line`, if any does."""
        words = WORD.findall(line)
        for template in self._candidates(words):
            head = _head(template.node)
            could = line.startswith(head) if head else any(word in template.text for word in words[:3])
            if could and template.prints(line):
                return template
        return None

    def lines_with(self, text: str) -> list[str]:
        """Sample lines (`Template.samples`) of every string that may print `text`: one whose source holds all of
        its longer words (one of them, when the string has values that may give the others)."""
        words = WORD.findall(text)
        longer = [word for word in words if len(word) > 3] or words
        return [
            line
            for t in self._candidates(words)
            if (any if "{" in t.text or "%" in t.text else all)(word in t.text for word in longer)
            for line in t.samples()
        ]

    def _candidates(self, words: list[str]) -> Iterator[Template]:
        """The strings of the modules where `words` can begin a string (its first two, else its first) or where one
        of its first longer words follows an f-string's value."""
        begin = self._where(_QUOTED_TWO, [" ".join(words[:2])]) if len(words) > 1 else set()
        after_value = [word for word in words if len(word) > 3][:2]  # a value seldom comes later than that
        paths = (begin or self._where(_QUOTED, words[:1])) | self._where(_AFTER_VALUE, after_value)
        return (t for path in sorted(paths) for t in self._file_templates(path))

    def _where(self, pattern: re.Pattern[str], words: list[str]) -> set[Path]:
        return {path for word in words for path in self._index[pattern].get(word, ())}

    def _tree(self, path: Path) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.texts[path])
            except SyntaxError:  # newer syntax than this interpreter reads: none of its strings are known
                self._trees[path] = None
        return self._trees[path]

    def _file_templates(self, path: Path) -> list[Template]:
        if path not in self._templates:
            tree = self._tree(path)
            lines = self.texts[path].splitlines()
            self._templates[path] = [] if tree is None else self._walk(tree, [tree], path, lines)
        return self._templates[path]

    def _walk(self, node: ast.AST, scopes: list[Body], path: Path, lines: list[str]) -> list[Template]:
        found = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += self._walk(child, [child, *scopes], path, lines)
            elif isinstance(child, ast.expr) and _is_text(child):
                text = "\n".join(lines[child.lineno - 1 : child.end_lineno])  # its lines: enough to find its words
                found.append(Template(self, child, scopes, f"{path.relative_to(self.root)}:{child.lineno}", text))
            else:
                found += self._walk(child, scopes, path, lines)
        return found

    def _assigned(self, name: str, scopes: list[Body]) -> list[ast.expr] | None:
        """What the innermost body that assigns `name` gives it (None: none does)."""
        for body in scopes:
            if id(body) not in self._scopes:
                self._scopes[id(body)] = _assignments(body.body)
            if name in self._scopes[id(body)]:
                return self._scopes[id(body)][name]
        return None

    def resolve(self, node: ast.expr, scopes: list[Body], depth: int, lead: bool = True) -> Parts:
        """The parts of the text `node` gives; `lead`: it begins the string (where an attribute's value is looked
        for, `f"{self.debug_name} watchdog timeout"`: elsewhere it is any text, which costs far less to find)."""
        if depth > MAX_DEPTH:
            return [ANY]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return _plain(node.value)
        if isinstance(node, ast.JoinedStr):
            parts: Parts = []
            for i, value in enumerate(node.values):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append(value.value)
                elif isinstance(value, ast.FormattedValue) and value.conversion == -1 and value.format_spec is None:
                    parts += self.resolve(value.value, scopes, depth + 1, lead and i == 0)
                else:  # a number's format, a repr: text of the program's
                    parts.append(ANY)
            return parts
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.resolve(node.left, scopes, depth + 1, lead) + self.resolve(node.right, scopes, depth + 1, False)
        if isinstance(node, ast.IfExp):
            return [self._choices([node.body, node.orelse], scopes, depth, lead)]
        if isinstance(node, ast.Name):
            values = self._assigned(node.id, scopes)
            if values is None and node.id.isupper():
                values = self._module_constants(node.id)
            return [self._choices(values, scopes, depth, lead)] if values else [ANY]
        if isinstance(node, ast.Attribute) and lead:
            passed = self._passed_by_keyword(node.attr)
            return [(*self._choices(passed, [], depth, lead), [ANY])] if passed else [ANY]
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            tables = self._assigned(node.value.id, scopes) or []
            entries = [entry for table in tables for entry in _table_values(table)]
            return [self._choices(entries, scopes, depth, lead)] if entries else [ANY]
        return [ANY]

    def _choices(self, values: list[ast.expr], scopes: list[Body], depth: int, lead: bool) -> tuple[Parts, ...]:
        if len(values) > MAX_CHOICES:
            return ([ANY],)
        unique: dict[str, Parts] = {}
        for value in values:
            parts = _tidy(self.resolve(value, scopes, depth + 1, lead))
            unique.setdefault(repr(parts), parts)
        return tuple(unique.values())

    def _module_constants(self, name: str) -> list[ast.expr]:
        """The values a module of the package gives its constant `name` (imported where it is used)."""
        trees = (self._tree(path) for path in sorted(self._where(_CONSTANT, [name])))
        return [value for tree in trees if tree is not None for value in self._assigned(name, [tree]) or []]

    def _passed_by_keyword(self, name: str) -> list[ast.expr]:
        """The strings the package's calls pass as `name=`: what an attribute of that name is often set from
        (`debug_name="Scheduler"`); none for a name too many modules pass."""
        if name not in self._passed:
            paths = self._where(_KEYWORD, [name])
            keywords = (self._keywords(path) for path in sorted(paths)) if len(paths) <= MAX_KEYWORD_FILES else ()
            self._passed[name] = [value for found in keywords for value in found.get(name, [])]
        return self._passed[name]

    def _keywords(self, path: Path) -> dict[str, list[ast.expr]]:
        """The strings each keyword is given in the calls of one module."""
        if path not in self._keyword_values:
            found: dict[str, list[ast.expr]] = {}
            tree = self._tree(path)
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.keyword) and node.arg is not None and _is_text(node.value):
                    found.setdefault(node.arg, []).append(node.value)
            self._keyword_values[path] = found
        return self._keyword_values[path]
