"""Reading one mutant's diff (mutmut's unified diff of a function, original -> mutant): which
mutator made it (`mutator_name`) and where in the original file the mutated text is (`locate`),
for the reports in mutants/mutation/report.py."""
import keyword
import re
from dataclasses import dataclass

from mutants.mutation.record import MutantRecord

_TOKEN = re.compile(r"""[rRbBuUfF]{0,2}('''|\"\"\"|'|")(?:\\.|(?!\1).)*?\1   # a string literal
    | \d[\w.]* | \w+ | \*\*=? | //=? | <<=? | >>=? | -> | := | [-+*/%@&|^<>=!]= | \S""", re.X | re.S)


@dataclass(frozen=True)
class _Edit:
    """A mutmut diff's change: its lines, and the tokens that differ between them."""
    lines: tuple[str, ...]      # the first run of '-' lines as the diff renders them (a method dedented)
    added: tuple[str, ...]      # the '+' lines right after them
    before: str | None          # the context line just before the change
    at: int                     # the change's line in mutmut's function text, 1-based
    old: list[str]              # the tokens that differ, before and after
    new: list[str]
    start: int                  # their span in "\n".join(lines), end exclusive
    end: int
    replacement: str            # the mutant's text for that span
    prev: str | None            # the unchanged tokens either side
    next: str | None
    depth: int                  # bracket depth where the change starts


def _edit(diff: str) -> _Edit | None:
    at, before, lines, added = None, None, [], []
    for line in diff.splitlines():
        if at is None:
            if m := re.match(r"@@ -(\d+)", line):
                at = int(m.group(1))
        elif line.startswith("-") and not added:
            lines.append(line[1:])
        elif line.startswith("+"):
            added.append(line[1:])
        elif lines or added:
            break
        elif not line.startswith("\\"):
            before, at = line[1:], at + 1
    if at is None or not (lines or added):
        return None
    a, b = "\n".join(lines), "\n".join(added)
    ta, tb = ([(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(t)] for t in (a, b))
    n, p, s = min(len(ta), len(tb)), 0, 0
    while p < n and ta[p][0] == tb[p][0]:
        p += 1
    while s < n - p and ta[-1 - s][0] == tb[-1 - s][0]:
        s += 1
    oa, ob = ta[p:len(ta) - s], tb[p:len(tb) - s]

    def span(toks: list, mid: list, text: str, extend: bool) -> tuple[int, int]:
        after = toks[len(toks) - s][1] if s else len(text)
        # An insertion or a deletion takes the blank up to the next token: "f(a, b)" -> "f(b)".
        return (mid[0][1], after if extend else mid[-1][2]) if mid else (after, after)
    (start, end), (new_start, new_end) = span(ta, oa, a, not ob), span(tb, ob, b, not oa)
    return _Edit(tuple(lines), tuple(added), before, at, [t for t, _, _ in oa], [t for t, _, _ in ob],
                 start, end, b[new_start:new_end], ta[p - 1][0] if p else None, ta[len(ta) - s][0] if s else None,
                 sum((t in "([{") - (t in ")]}") for t, _, _ in ta[:p]))


_COMPARE = {"==", "!=", "<", "<=", ">", ">="}
_ARITH = {"+", "-", "*", "/", "//", "%", "**", "@", "<<", ">>", "&", "|", "^"}


def _operand(token: str | None) -> bool:
    """Whether token can end an operand, so that an operator after it is binary."""
    return bool(token) and (token[-1] in ")]}'\"_" or token[-1].isalnum()) \
        and (not keyword.iskeyword(token) or token in ("True", "False", "None"))


def mutator_name(diff: str) -> str:
    """A short name for the kind of change, from the tokens that differ; the first rule that matches:

    | tokens that differ (old -> new)                                    | name                  |
    |--------------------------------------------------------------------|-----------------------|
    | == != < <= > >= for another; `not` added or removed at `is`/`in`   | EqualityOperator      |
    | `and` <-> `or`                                                     | LogicalOperator       |
    | an augmented assignment (`+=`, ...) -> another one or `=`          | AssignmentOperator    |
    | + - * / // % ** @ << >> & | ^ for another, after an operand       | ArithmeticOperator    |
    | the same with no operand before (unary); `not` or `~` removed      | UnaryOperator         |
    | `True` <-> `False`                                                 | BooleanLiteral        |
    | `and False` / `or True` appended to a condition                    | ConditionalExpression |
    | anything -> `None` right after a statement's `=`                   | AssignmentToNone      |
    | anything -> `None` after `(`, `,`, a keyword's `=`, or a line start| ArgumentToNone        |
    | tokens removed with a `,` or after `(`/`,`/a line start (no `case`)| ArgumentRemoved       |
    | a number for a number                                              | NumericLiteral        |
    | a string literal on either side                                    | StringLiteral         |
    | a called name for another (`.lower(` -> `.upper(`)                 | MethodExpression      |
    | break / continue / return for another                              | ControlFlowKeyword    |
    | anything else                                                      | Mutation              |
    """
    if (e := _edit(diff)) is None:
        return "Mutation"
    old, new = e.old, e.new
    pair = {*old, *new} if len(old) == len(new) == 1 else set()
    rules = (
        ("EqualityOperator", (pair and pair <= _COMPARE)
         or (sorted((old, new)) == [[], ["not"]] and (e.prev == "is" or e.next == "in"))),
        ("LogicalOperator", pair == {"and", "or"}),
        ("AssignmentOperator", pair and old[0] != "=" and all(t[-1] == "=" and t[:-1] in _ARITH | {""} for t in pair)),
        ("ArithmeticOperator", pair and pair <= _ARITH and _operand(e.prev)),
        ("UnaryOperator", (pair and pair <= _ARITH) or (old in (["not"], ["~"]) and not new)),
        ("BooleanLiteral", pair == {"True", "False"}),
        ("ConditionalExpression", new[-2:] in (["and", "False"], ["or", "True"])),
        ("AssignmentToNone", new == ["None"] and e.prev in ("=", ":=") and e.depth == 0),
        ("ArgumentToNone", new == ["None"] and e.prev in ("(", ",", "=", None)),
        ("ArgumentRemoved", old and not new and old[0] != "case" and ("," in old or e.prev in ("(", ",", None))),
        ("NumericLiteral", pair and all(t[0].isdigit() for t in pair)),
        ("StringLiteral", any(re.match(r"[rRbBuUfF]{0,2}['\"]", t) for t in old + new)),
        ("MethodExpression", pair and all(t.isidentifier() for t in pair) and e.next == "("),
        ("ControlFlowKeyword", pair and pair <= {"break", "continue", "return"}),
    )
    return next((name for name, hit in rules if hit), "Mutation")


def _def_line(function: str, lines: list[str]) -> int:
    """1-based line of the function's def (a method's after its class), 1 if there is none."""
    *owner, name = function.split(".")
    pattern = re.compile(rf"\s*(async\s+)?def\s+{re.escape(name)}\s*\(")
    owner_line = re.compile(rf"\s*class\s+{re.escape(owner[-1])}\b") if owner else None
    start = next((i for i, line in enumerate(lines) if owner_line and owner_line.match(line)), 0)
    found = (i + 1 for first in (start, 0) for i in range(first, len(lines)) if pattern.match(lines[i]))
    return next(found, 1)


def place(record: "MutantRecord", source: str) -> tuple[tuple[int, int, int, int], str | None]:
    """locate(), and the mutant's text for the located span."""
    lines = source.splitlines()
    def_line = _def_line(record.function, lines)
    fallback = (def_line, 1, def_line, len(lines[def_line - 1]) + 1 if lines else 1)
    indent = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    try:
        e = _edit(record.diff)
        block = (e.lines or ((e.before,) if e.before is not None else ())) if e else ()
        want = [line.strip() for line in block]
        starts = [i for i in range(def_line, len(lines) - len(block) + 2)
                  if want and [lines[i - 1 + k].strip() for k in range(len(block))] == want]
        if not starts:
            return fallback, None
        # The @@ header counts from the function text's first line (its def, unless decorated),
        # so among repeated lines the one nearest that hint is meant.
        first = min(starts, key=lambda i: (abs(i - (def_line + e.at - 1 - (not e.lines))), i))
        if not e.lines:  # a pure insertion: point at the line it follows
            line = lines[first - 1]
            return (first, indent(line) + 1, first, len(line.rstrip()) + 1), "\n".join(s.strip() for s in e.added)
        text = "\n".join(e.lines)

        def position(offset: int) -> tuple[int, int]:
            k, column = text.count("\n", 0, offset), offset - text.rfind("\n", 0, offset) - 1
            # mutmut renders a method dedented; the file's own indentation decides the column.
            return first + k, max(1, column + indent(lines[first - 1 + k]) - indent(e.lines[k]) + 1)
        return (*position(e.start), *position(e.end)), e.replacement
    except Exception:  # one odd diff must not cost the whole report; the def line still points the way
        return fallback, None


def locate(record: "MutantRecord", source: str) -> tuple[int, int, int, int]:
    """(start_line, start_column, end_line, end_column) of the mutated text in the original file:
    1-based, end exclusive as in the Stryker schema. The def line, column 1, when the diff cannot be
    placed. Never raises."""
    return place(record, source)[0]
