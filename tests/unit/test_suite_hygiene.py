"""The suite never compares served scores for exact equality across requests.

A score or a vector's component moves in its last bits with the batch it runs in (padding, and kernels that sum
in another order for another shape; docs/api.md bounds it at 1e-5), and two requests' items can land in batches
of other sizes and partners, all the more once the batch-cost fit has learnt from other traffic. So
``assert first == second`` on two answers passes on an idle machine and fails now and then on a loaded one.

The rule, on each test file's syntax tree, one function at a time: an ``==`` is flagged when both of its sides
carry served scores. A side carries them when it is

- a subscript or an attribute named ``score``, ``scores``, ``relevance_score``, ``embedding`` (a score or a
  vector) or ``results``, ``data`` (a whole answer's list of them): ``body["data"][0]["score"]``,
  ``item.embedding``, ``json.loads(raw)["results"]``, ``_lone(...).results``;
- a subscript, by anything but a string, of a side that carries them (``scores[0]``, ``scores[i]``,
  ``scores[:5]``);
- a call of a test helper that returns them (:data:`SCORE_CALLS`: ``_lone``, ``score``, ``_floats``), with any
  arguments;
- a list, tuple or set, or a list, set or dict comprehension, whose elements carry them
  (``[item.embedding for item in response.data]``);
- a name assigned, anywhere in the same function or a function around it, from a side that carries them
  (``expected = _lone(...)``; ``first, second = second, answer["results"]``).

Anything else does not: a call of another function (``pytest.approx(...)``, ``sorted(scores)``, ``len(...)``),
any other key or attribute (``["index"]``, ``.items``, ``.usage``), constants. So ``got == pytest.approx(...)``
and ``[r["index"] for r in body["results"]] == order`` pass, and so does ``!=``, which batch noise can only
make truer. Where an exact comparison is right, as between two copies of one input in one request (each
distinct input runs once and every copy shares its result), the comparison's line says why after
:data:`MARKER`, e.g. ``# exact: identical inputs in one request``.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
SCORE_KEYS = frozenset({"score", "scores", "relevance_score", "embedding", "results", "data"})
# The suite's helpers that return served scores or vectors.
SCORE_CALLS = frozenset({"_lone", "score", "_floats"})
MARKER = "# exact:"

Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.Module


def _called(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _carries(node: ast.expr, names: set[str]) -> bool:
    """Whether ``node`` carries served scores; ``names`` are the scope's names already known to."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value in SCORE_KEYS
        return _carries(node.value, names)
    if isinstance(node, ast.Attribute):
        return node.attr in SCORE_KEYS
    if isinstance(node, ast.Call):
        return _called(node) in SCORE_CALLS
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return any(_carries(element, names) for element in node.elts)
    if isinstance(node, ast.ListComp | ast.SetComp):
        return _carries(node.elt, names)
    if isinstance(node, ast.DictComp):
        return _carries(node.value, names)
    return False


def _own_nodes(scope: Scope) -> Iterator[ast.AST]:
    """The nodes of ``scope`` outside the functions nested in it (each is a scope of its own)."""
    todo: list[ast.AST] = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def _bindings(target: ast.expr, value: ast.expr) -> Iterator[tuple[str, ast.expr]]:
    """(name, the expression it is assigned) for an assignment, unpacking ``a, b = x, y`` pairwise."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif (
        isinstance(target, ast.Tuple | ast.List)
        and isinstance(value, ast.Tuple | ast.List)
        and len(target.elts) == len(value.elts)
    ):
        for sub_target, sub_value in zip(target.elts, value.elts, strict=True):
            yield from _bindings(sub_target, sub_value)


def _score_names(scope: Scope, outer: set[str]) -> set[str]:
    """``outer`` (the enclosing scopes' names), and the names assigned somewhere in ``scope`` from an expression
    that carries served scores."""
    pairs: list[tuple[str, ast.expr]] = []
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs.extend(_bindings(target, node.value))
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            pairs.extend(_bindings(node.target, node.value))
    names = set(outer)
    grown = True
    while grown:  # ``first = second`` after ``second = answer["results"]``: until nothing more is learnt
        grown = False
        for name, value in pairs:
            if name not in names and _carries(value, names):
                names.add(name)
                grown = True
    return names


def _marked_lines(source: str) -> set[int]:
    return {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and token.string.startswith(MARKER) and token.string[len(MARKER) :].strip()
    }


def exact_score_comparisons(source: str) -> list[int]:
    """The lines of ``source`` with an ``==`` between two sides that carry served scores, and no marker."""
    marked = _marked_lines(source)
    found: set[int] = set()
    scopes: list[tuple[Scope, set[str]]] = [(ast.parse(source), set())]
    while scopes:
        scope, outer = scopes.pop()
        names = _score_names(scope, outer)
        for node in _own_nodes(scope):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                scopes.append((node, names))
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                exact = any(
                    isinstance(op, ast.Eq) and _carries(left, names) and _carries(right, names)
                    for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True)
                )
                if exact and not marked.intersection(range(node.lineno, (node.end_lineno or node.lineno) + 1)):
                    found.add(node.lineno)
    return sorted(found)


def test_no_exact_comparison_of_served_scores_in_the_suite() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in exact_score_comparisons(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "served scores compared with == (compare them to 1e-5: tests.live.close_answers or pytest.approx; or, "
        f"where they are the same input within one request, say so after '{MARKER}'): {found}"
    )


def test_the_rule_flags_answers_compared_across_requests() -> None:
    flagged = """
def test(live, app, body):
    expected = _lone(live, app, body)
    assert _lone(live, app, body) == expected
    first = second = None
    for _ in range(2):
        first, second = second, json.loads(read(sock))["results"]
    assert first == second
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert scores[0] == other["data"][0]["score"]
    assert [item.embedding for item in a.data] == [item.embedding for item in b.data]
"""
    assert exact_score_comparisons(flagged) == [4, 8, 10, 11]


def test_the_rule_passes_tolerances_indices_and_marked_lines() -> None:
    passed = """
def test(live, app, body):
    expected = _lone(live, app, body)
    again = _lone(live, app, body)
    assert again.items == expected.items and close_answers(again.results, expected.results)
    assert [r["index"] for r in again.results] == [r["index"] for r in expected.results]
    assert [d["score"] for d in body["data"]] == pytest.approx(reference, abs=1e-5)
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == scores[2]  # exact: identical inputs in one request
    assert len(body["data"]) == 3 and body["data"] != other["data"]
"""
    assert exact_score_comparisons(passed) == []
