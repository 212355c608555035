"""``stepledger/_core.pyi`` says what the compiled core and its pure-Python reference provide.

The stub is read as source (``ast``) and held to the modules themselves: every public name of the built
``_core`` is in the stub and every name of the stub is in ``_core``; the same for ``_fallback``, whose only
names beyond the stub's are its encoding helpers (``FALLBACK_ONLY``). Each function and method has the
parameters ``inspect.signature`` gives for the compiled one (Cython gives one for every ``def``), and the
names and defaults of the fallback's.
"""

import ast
import inspect
import pathlib
import types

import pytest

import stepledger
from stepledger import _fallback

_core = pytest.importorskip("stepledger._core", reason="the compiled core is not built here")

STUB = pathlib.Path(stepledger.__file__).parent / "_core.pyi"
# The reference's helpers for reading kept values (report.read decodes with them); the compiled core has none.
FALLBACK_ONLY = {"canonical_tag_dtype", "decode_leaves", "dtype_tag", "encode_leaves", "leaf_header"}
# The token layout the compiled core was built for: only a compiled core has one.
CORE_ONLY = {"COMPILED_LAYOUT"}
# Attributes the fallback sets in __init__ that the compiled core keeps private (cdef, not public).
FALLBACK_PRIVATE_STATE = {"EventRecorder": {"reward_is_f32"}, "VectorRecorder": {"n", "is_f32"}}


def _public(module):
    return {n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}


def _stub(path=STUB):
    """{name: ast node} of the stub's public names, and {class: {member: ("method" | "attribute", node)}}."""
    tree = ast.parse(path.read_text(), str(path))
    names, classes = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.AnnAssign):
            name = node.target.id
        elif isinstance(node, ast.Assign):
            name = node.targets[0].id
        else:
            continue
        if name.startswith("_"):
            continue
        names[name] = node
        if isinstance(node, ast.ClassDef):
            members = classes[name] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    prop = any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
                    members[item.name] = ("attribute" if prop else "method", item)
                elif isinstance(item, ast.AnnAssign):
                    members[item.target.id] = ("attribute", item)
    return names, classes


def _stub_params(fn):
    """[(name, kind, default source or None)] of a stub function, ``self``/``cls`` left out."""
    a = fn.args
    out = []
    positional = [(p, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs] + \
        [(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for (p, kind), d in zip(positional, defaults):
        out.append((p.arg, kind, None if d is None else ast.literal_eval(d)))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, inspect.Parameter.KEYWORD_ONLY, None if d is None else ast.literal_eval(d)))
    return [x for x in out if x[0] not in ("self", "cls")]


def _runtime_params(obj, kinds=True):
    out = []
    for p in inspect.signature(obj).parameters.values():
        if p.name in ("self", "cls"):
            continue
        default = None if p.default is inspect.Parameter.empty else p.default
        out.append((p.name, p.kind if kinds else None, default))
    return out


def _without_kinds(params):
    return [(n, None, d) for n, _, d in params]


def test_the_stub_names_what_the_compiled_core_has_and_no_more():
    names, _ = _stub()
    assert set(names) == _public(_core)


def test_the_stub_names_what_the_fallback_has_but_its_encoding_helpers():
    names, _ = _stub()
    assert _public(_fallback) - set(names) == FALLBACK_ONLY
    assert set(names) - _public(_fallback) == CORE_ONLY


def test_functions_have_the_compiled_cores_parameters_and_the_fallbacks():
    names, _ = _stub()
    functions = {n: node for n, node in names.items() if isinstance(node, ast.FunctionDef)}
    assert functions, "the stub declares no function"
    for name, node in sorted(functions.items()):
        stub = _stub_params(node)
        assert callable(getattr(_core, name)), name
        assert _runtime_params(getattr(_core, name)) == stub, name
        assert _runtime_params(getattr(_fallback, name), kinds=False) == _without_kinds(stub), name


def test_classes_have_the_compiled_cores_members_and_the_fallbacks():
    _, classes = _stub()
    assert set(classes) == {"StreamBuffer", "EventRecorder", "VectorRecorder"}
    for cls_name, members in sorted(classes.items()):
        compiled, reference = getattr(_core, cls_name), getattr(_fallback, cls_name)
        methods = {m for m, (what, _) in members.items() if what == "method" and m not in ("__init__", "__new__")}
        attributes = {m for m, (what, _) in members.items() if what == "attribute"}
        # the compiled class: its public methods (and __len__), its public attributes (getset descriptors)
        c_methods = {m for m, v in vars(compiled).items() if (not m.startswith("_") or m == "__len__")
                     and callable(v) and not inspect.isdatadescriptor(v)}
        c_attributes = {m for m, v in vars(compiled).items() if not m.startswith("_") and inspect.isdatadescriptor(v)}
        assert methods == c_methods, cls_name
        assert attributes == c_attributes, cls_name
        # the reference: the same methods; the same attributes, on an instance or as properties
        r_methods = {m for m, v in vars(reference).items() if (not m.startswith("_") or m == "__len__")
                     and callable(v)}
        assert methods == r_methods, cls_name
        for m in sorted(methods):
            stub = _stub_params(members[m][1])
            assert _runtime_params(getattr(compiled, m)) == stub, (cls_name, m)
            assert _runtime_params(getattr(reference, m), kinds=False) == _without_kinds(stub), (cls_name, m)
        # the constructor: Cython gives no signature for it (cdef classes), the reference does
        ctor = members.get("__init__") or members.get("__new__")
        assert ctor is not None, cls_name
        assert _runtime_params(reference.__init__, kinds=False) == _without_kinds(_stub_params(ctor[1])), cls_name
        r_properties = {m for m, v in vars(reference).items() if isinstance(v, property)}
        instance = _instance(cls_name)
        r_attributes = {m for m in vars(instance) if not m.startswith("_")} | r_properties
        assert r_attributes - attributes == FALLBACK_PRIVATE_STATE.get(cls_name, set()), cls_name
        assert attributes <= r_attributes, cls_name


def _instance(cls_name):
    """A fallback instance, for the attributes its __init__ sets."""
    import gymnasium as gym

    from stepledger.format.spaces import LeafLayout
    layout = LeafLayout(gym.spaces.Box(-1, 1, (2,)))
    if cls_name == "StreamBuffer":
        return _fallback.StreamBuffer()
    if cls_name == "EventRecorder":
        return _fallback.EventRecorder(_fallback.StreamBuffer(), layout, layout, True)
    return _fallback.VectorRecorder([_fallback.StreamBuffer()], layout, layout, True)


def test_a_name_left_out_of_the_stub_is_found(tmp_path):
    """The check above can fail: a stub without one of the core's functions is caught."""
    text = STUB.read_text()
    cut = "\n".join(line for line in text.splitlines() if not line.startswith("def memory_limit("))
    assert cut != text
    path = tmp_path / "_core.pyi"
    path.write_text(cut)
    names, _ = _stub(path)
    assert _public(_core) - set(names) == {"memory_limit"}
