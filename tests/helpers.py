"""Test helpers: paths to real models shipped by the onnx package, and a tiny generated model."""

import os
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def calm_policy():
    """A QuietPolicy under which any load counts as quiet: for a test that looks at what is cached, not at
    the load (the suite's other processes, a worker pool still starting, may share the cores)."""
    from dynatune.machine.load import QuietPolicy

    return QuietPolicy(tolerance_cores=float(os.cpu_count() or 1))


_template_lock = threading.Lock()


def _prefect_home_template(environ: dict | None = None) -> str:
    """The session's migrated Prefect home, built on first use (once, whichever thread asks first) in the
    environment ``environ`` (default: this process's)."""
    import atexit
    import shutil
    import subprocess
    import sys
    import tempfile

    template = os.path.join(tempfile.gettempdir(), f"dynatune-tests-prefect-home-{os.getpid()}")
    with _template_lock:
        if not os.path.exists(os.path.join(template, "prefect.db")):
            building = template + ".tmp"
            shutil.rmtree(building, ignore_errors=True)
            for d in (building, template):
                atexit.register(shutil.rmtree, d, True)
            env = {k: v for k, v in (environ or os.environ).items() if not k.startswith("PREFECT_")}
            subprocess.run(
                [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                env={**env, "PREFECT_HOME": building},
                check=True,
                capture_output=True,
                timeout=300,
            )
            os.replace(building, template)
    return template


def prepare_prefect_home_template() -> None:
    """Start building the session's migrated Prefect home in the background (11 s, mostly one process
    migrating a database), so that the first test that needs one does not wait for all of it."""
    environ = dict(os.environ)  # now: the tests change the environment as they run

    def build():
        try:
            _prefect_home_template(environ)
        except Exception:  # built again, in the foreground, by the first prefect_home() (and fails there)
            pass

    threading.Thread(target=build, name="prefect-home-template", daemon=True).start()


def prefect_home(path) -> str:
    """``path`` made a Prefect home whose database is migrated already: a copy of one home migrated once
    per test session. A fresh home's first flow run migrates Prefect's database, about 6 s of every run a
    test starts (a user's home is migrated once)."""
    import shutil

    template = _prefect_home_template()
    path = os.fspath(path)
    if not os.path.exists(os.path.join(path, "prefect.db")):
        shutil.copytree(template, path, dirs_exist_ok=True)
    return path


_shared_api: dict = {}
_shared_api_lock = threading.Lock()


def shared_prefect_api() -> str:
    """The URL of a real Prefect API server on loopback, one per test process, started on first use (as
    Prefect's local mode starts one, in a migrated home of its own) and stopped at exit. The CLI runs tests
    start use it: each would otherwise start a local server of its own, about 12 s of CPU (16 of them in a
    run of the suite). The tests of the local mode itself (``tests/run/test_pipeline.py``, the README job's
    way) and of what Prefect records (``tests/test_secrets.py``) keep their own."""
    import atexit
    import shutil
    import tempfile

    from dynatune.flows.startup import spawn_api_server, stop_api_server, wait_for_api_server

    with _shared_api_lock:
        if "url" in _shared_api:
            return _shared_api["url"]
        home = tempfile.mkdtemp(prefix="dynatune-tests-prefect-api-")
        atexit.register(shutil.rmtree, home, True)  # after the server stops (atexit runs last first)
        prefect_home(home)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        proc, port = spawn_api_server(
            {**env, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        )
        atexit.register(stop_api_server, proc)
        if not wait_for_api_server(proc, port, 180):
            raise RuntimeError(f"the tests' Prefect API server did not come up (exit status {proc.poll()})")
        _shared_api["url"] = f"http://127.0.0.1:{port}/api"
        return _shared_api["url"]


def cli_environment(cwd) -> dict:
    """The environment of a CLI run a test starts from ``cwd``: this checkout's code, Prefect's home in
    ``cwd`` and the tests' Prefect API (:func:`shared_prefect_api`), no tracking server from the
    environment."""
    env = dict(os.environ, PYTHONPATH=ROOT, PREFECT_HOME=prefect_home(os.path.join(cwd, ".prefect")))
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PREFECT_API_URL"] = shared_prefect_api()
    return env


def run_cli(args, cwd, timeout: float = 300):
    """``dynatune ARGS`` in a subprocess run from ``cwd``, in :func:`cli_environment`."""
    import subprocess
    import sys

    env = cli_environment(cwd)
    return subprocess.run(
        [sys.executable, "-m", "dynatune.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def light_model(name: str) -> str:
    import onnx

    return os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx"
    )


LIGHT_MODELS = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]


def import_and_extract(name: str) -> tuple[list, list]:
    """The light model ``name`` imported and its tasks extracted for this machine's CPU (the ``cpu_target``
    fixture's target), as plain data: (each input's shape, each task's (weight, FLOPs, key)). Run in a
    worker process (tests/model/test_model.py)."""
    from dynatune.machine.target import make_target
    from dynatune.model.extract import extract_tasks
    from dynatune.model.importer import load_model

    model = load_model(light_model(name))
    tasks = extract_tasks(model, make_target())
    return [list(i.shape) for i in model.inputs], [(t.weight, t.flops, t.key) for t in tasks]


def save_onnx(graph, path: str) -> str:
    """``graph`` as an opset-17 ONNX model at ``path`` (IR version 8, what ONNX Runtime reads)."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def save_float_model(path: str, name: str, nodes, inits, x_shape, y_shape) -> str:
    """``nodes`` from one float input ``x`` to one float output ``y``, saved as :func:`save_onnx`."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        inits,
    )
    return save_onnx(graph, path)


def make_tiny_onnx(path: str, batch="N", channels: int = 8, seed: int = 0, extra_layer: bool = False) -> str:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["a1"], name="add1"),
    ]
    inits = [
        w("w1", channels, 3, 3, 3),
        w("b1", channels),
        w("w2", channels, channels, 3, 3),
        w("b2", channels),
        w("fc_w", 10, channels),
        w("fc_b", 10),
    ]
    last = "a1"
    if extra_layer:
        nodes.append(helper.make_node("Conv", ["a1", "w3", "b3"], ["c3"], pads=[0, 0, 0, 0], name="conv3"))
        inits += [w("w3", channels, channels, 1, 1), w("b3", channels)]
        last = "c3"
    nodes += [
        helper.make_node("GlobalAveragePool", [last], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def make_maxpool_onnx(path: str, channels: int = 8, seed: int = 0, size: int = 17, ceil_mode: int = 0) -> str:
    """conv 3x3 -> relu -> max pool 3x3 stride 2 -> conv 1x1 -> ``y``: a small model with a max pool, whose
    TOPI block names a custom schedule rule (``meta_schedule.pool_max``) that TVM 0.27 does not have. With
    ``size=16, ceil_mode=1`` the pool pads its input, as SqueezeNet's do."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=ceil_mode, name="pool1"
        ),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["y"], name="conv2"),
    ]
    inits = [
        w("w1", channels, 3, 3, 3),
        w("b1", channels),
        w("w2", channels, channels, 1, 1),
        w("b2", channels),
    ]
    graph = helper.make_graph(
        nodes,
        "maxpool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def randomized_light_model(name: str, out_path: str, seed: int = 0) -> str:
    """A light model with its ConstantOfShape weights replaced by random initializers.

    The onnx package's light models carry real topologies but constant weights, which makes every output
    identical whatever the compiler does; random weights make the numerics check meaningful. Batch norm
    variances are made positive (a negative one makes every output NaN, which any compiler matches).
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    m = onnx.load(light_model(name))
    g = m.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    rng = np.random.default_rng(seed)
    variances = {node.input[4] for node in g.node if node.op_type == "BatchNormalization"}
    keep, new_inits = [], []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            arr = (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)
            if node.output[0] in variances:
                arr = np.abs(arr) + np.float32(0.5)
            new_inits.append(numpy_helper.from_array(arr, node.output[0]))
        else:
            keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    used = {i for n in keep for i in n.input}
    kept_inits = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept_inits + new_inits)
    names = {i.name for i in g.initializer}
    real = [i for i in g.input if i.name not in names and i.name in used]
    del g.input[:]
    g.input.extend(real)
    onnx.save(m, out_path)
    return out_path


def make_embedding_onnx(path: str, vocab: int = 50, dim: int = 8, tokens: int = 64, seed: int = 0) -> str:
    """An embedding lookup feeding a convolution: int64 ``ids`` [1, tokens] -> Gather on a constant table
    [vocab, dim] -> [1, tokens, dim] -> Transpose -> Reshape to NCHW [1, dim, side, side] -> Conv 3x3 ->
    ``y``.

    ``tokens`` must be a square. The Gather becomes a ``take`` task whose index input must stay within
    ``[0, vocab)`` when measured.
    """
    import math

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    side = math.isqrt(tokens)
    assert side * side == tokens, "tokens must be a square"
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "table"),
        numpy_helper.from_array(np.array([1, dim, side, side], np.int64), "nchw"),
        numpy_helper.from_array(rng.standard_normal((dim, dim, 3, 3)).astype(np.float32) * 0.2, "w"),
        numpy_helper.from_array(rng.standard_normal(dim).astype(np.float32) * 0.2, "b"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="embed"),
        helper.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 1], name="transpose"),
        helper.make_node("Reshape", ["et", "nchw"], ["x"], name="to_nchw"),
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv"),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, tokens])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim, side, side])
    graph = helper.make_graph(nodes, "embedding", [ids], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def run_in_plain_tvm(model, artifact: str, tmp_path, extra_check: str = ""):
    """Run an exported artifact as its user would: a fresh process with plain TVM (no dynatune importable),
    ``vm["main"](x)`` on the model's random input; ``extra_check`` is more Python run there (``vm`` is
    defined). Returns the comparison of its output with ONNX Runtime's."""
    import subprocess
    import sys

    import numpy as np

    from dynatune.compiler.compile import compare
    from dynatune.compiler.execution import onnxruntime_outputs

    x = model.random_inputs(0)[model.inputs[0].name]
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys, numpy as np, tvm; from tvm import relax;"
        "vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu());"
        "y = vm['main'](tvm.runtime.tensor(np.load(sys.argv[2]))); np.save(sys.argv[3], y.numpy());"
        "assert 'dynatune' not in sys.modules;" + extra_check
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-c", code, artifact, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        check=True,
        env=env,
        cwd=str(tmp_path),
    )
    _, ref = onnxruntime_outputs(model, {model.inputs[0].name: x}, 2)
    return compare([np.load(tmp_path / "y.npy")], ref)


class PlantedPayload:
    """Unpickling this creates ``marker``: what a hostile work dir would do (it could run any command)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant_pickle(path, marker) -> None:
    """A pickle at ``path`` (shaped as dynatune's old cost-model file) whose loading creates ``marker``."""
    import pickle

    with open(path, "wb") as f:
        pickle.dump({"format": "dynatune.surrogate.EnsembleModel/1", "data": PlantedPayload(str(marker))}, f)


def no_wait_policy():
    """Time at once, even on a busy machine: waiting for a quiet one (and retrying) is
    tests/machine/test_load.py's."""
    from dynatune.machine.load import QuietPolicy

    return QuietPolicy(probe_s=0.2, attempts=1)


def few_trials_session(tasks, target, work: str):
    """A real tuning session sized for a test's few trials: batches of 4, a population of 16, 3 repeats."""
    from dynatune.search.measure import MeasureConfig
    from dynatune.search.session import SearchConfig, TuningSession

    search = SearchConfig(trials_per_iter=4, population_size=16, init_min_unmeasured=8, genetic_num_iters=1)
    return TuningSession(tasks, target, work, search=search, measure=MeasureConfig(repeat=3, min_repeat_ms=5))


def make_winograd_cnn(tmp_path, rng) -> str:
    """3x3 convolutions with ReLU: 16->32 at 48x48 (eligible), 32->32 stride 2 (not), 32->16 at 24x24
    (eligible), 16->16 stride 2 (not), 16->16 at 12x12 (9 tiles: too few), 16->8 (too few channels)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    layers = [("a", 16, 32, 1, True), ("b", 32, 32, 2, True), ("c", 32, 16, 1, True), ("d", 16, 16, 2, True)]
    layers += [("e", 16, 16, 1, True), ("f", 16, 8, 1, False)]
    nodes, inits, src = [], [], "x"
    for name, cin, cout, stride, relu in layers:
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"{name}_w"),
            numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"{name}_b"),
        ]
        out = f"{name}_c" if relu else "y"
        nodes.append(
            helper.make_node(
                "Conv", [src, f"{name}_w", f"{name}_b"], [out], pads=[1] * 4, strides=[stride] * 2
            )
        )
        if relu:
            nodes.append(helper.make_node("Relu", [out], [name]))
            out = name
        src = out
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 48, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])],
        inits,
    )
    path = str(tmp_path / "cnn.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def repeated_blocks_onnx(path: str, blocks: int = 4, channels: int = 8) -> str:
    """A 3x3 convolution, then ``blocks`` 1x1 convolutions with ReLU of one shape (one kernel, called
    ``blocks`` times, each time between two other storages), a global pool, a flatten and a gemm."""
    import numpy as np
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["h0"], pads=[1, 1, 1, 1])]
    inits = [w("w0", channels, 3, 3, 3), w("b0", channels)]
    for i in range(1, blocks + 1):
        nodes += [
            helper.make_node("Conv", [f"h{i - 1}", f"w{i}", f"b{i}"], [f"c{i}"]),
            helper.make_node("Relu", [f"c{i}"], [f"h{i}"]),
        ]
        inits += [w(f"w{i}", channels, channels, 1, 1), w(f"b{i}", channels)]
    nodes += [
        helper.make_node("GlobalAveragePool", [f"h{blocks}"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    inits += [w("fc_w", 10, channels), w("fc_b", 10)]
    return save_float_model(path, "repeated_blocks", nodes, inits, [1, 3, 12, 12], [1, 10])


def function_text(text: str, name: str = "main") -> str:
    """One function's part of an executable's text (``executable.as_text()``): from ``@name:`` to the
    next function's."""
    import re

    match = re.search(rf"^@{re.escape(name)}:\n(.*?)(?=^@|\Z)", text, re.M | re.S)
    assert match, f"no function {name} in the executable"
    return match.group(1)


def vm_calls(text: str, function: str = "main"):
    """How many times each function is called by ``function`` in an executable's text
    (``executable.as_text()``): a ``collections.Counter``."""
    import collections

    return collections.Counter(
        line.split()[1]
        for line in function_text(text, function).splitlines()
        if line.strip().startswith("call")
    )
