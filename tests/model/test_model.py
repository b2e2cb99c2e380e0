import json
import os
import subprocess
import sys

import pytest
from helpers import LIGHT_MODELS, ROOT, import_and_extract, light_model, make_tiny_onnx

from dynatune.errors import DynatuneError
from dynatune.model.importer import load_model, parse_shape

# 3-11 s each: the slow tier
BIG_LIGHT_MODELS = {"inception_v2", "shufflenet", "bvlc_alexnet", "zfnet512", "squeezenet"}
# Left out to keep the suite in its 15 minutes, each adding no operator the others lack: densenet121 (17 s:
# 120 convolutions joined by concatenations, as squeezenet and inception_v2 join theirs), inception_v1 (24 s)
# and resnet50 (5 s; tests/model/test_layout_glue.py imports and lowers it)
IMPORTED_LIGHT_MODELS = [n for n in LIGHT_MODELS if n not in ("densenet121", "inception_v1", "resnet50")]


# the slowest first: the workers finish together
IMPORT_ORDER = ["inception_v2", "squeezenet", "vgg19", "shufflenet", "zfnet512", "bvlc_alexnet"]


@pytest.fixture(scope="module")
def light_imports(request):
    """Each light model the session runs the test below on, imported and extracted in worker processes, as
    many at a time as there are cores: one import is a single thread (inception_v2: 11 s, a quarter of it
    its constants folded). {name: future of helpers.import_and_extract(name)}."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    names = [
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and item.originalname == "test_light_models_import_and_extract"
    ]
    names.sort(key=lambda n: IMPORT_ORDER.index(n) if n in IMPORT_ORDER else len(IMPORT_ORDER))
    workers = max(1, min(len(names), len(os.sched_getaffinity(0)), 4))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield {name: pool.submit(import_and_extract, name) for name in names}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in BIG_LIGHT_MODELS else n for n in IMPORTED_LIGHT_MODELS],
)
def test_light_models_import_and_extract(name, light_imports):
    shapes, tasks = light_imports[name].result(timeout=600)
    assert shapes and all(d > 0 for shape in shapes for d in shape)
    assert len(tasks) >= 5
    for weight, flops, key in tasks:
        assert weight >= 1 and flops >= 0 and len(key) == 16
    assert len({key for _, _, key in tasks}) == len(tasks)
    assert max(flops for _, flops, _ in tasks) > 1e6


def test_weights_are_parameters_and_get_bound(tiny_onnx):
    model = load_model(tiny_onnx, {"x": (1, 3, 16, 16)})
    assert len(model.params) == 6  # the initializers became parameters of main
    assert len(model.mod["main"].params) == 1 + 6
    assert len(model.bound_module()["main"].params) == 1


def test_dynamic_dim_without_shape_names_input_and_dim(tiny_onnx):
    with pytest.raises(DynatuneError) as err:
        load_model(tiny_onnx)
    assert "'x'" in str(err.value) and "dim 0" in str(err.value) and "'N'" in str(err.value)
    hint = str(err.value).split("--shape ")[1].split(",")[0]  # the hint is a shape that works
    assert hint == "x=1x3x16x16" and load_model(tiny_onnx, dict([parse_shape(hint)])).inputs[0].shape[0] == 1


def test_shape_for_missing_input(tiny_onnx):
    with pytest.raises(DynatuneError, match="'nope'.*does not have"):
        load_model(tiny_onnx, {"nope": (1, 3, 16, 16)})


def test_shape_with_wrong_rank(tiny_onnx):
    with pytest.raises(DynatuneError, match="2 dims"):
        load_model(tiny_onnx, {"x": (1, 3)})


def test_shape_that_contradicts_a_static_dim(tmp_path):
    """Only the batch dim (dim 0) of a static shape may be changed: another contradicts the model."""
    static = make_tiny_onnx(str(tmp_path / "static.onnx"), batch=1)  # x: 1x3x16x16
    with pytest.raises(DynatuneError, match=r"dim 1 as 4, but the model fixes it at 3.*--shape x=2x3x16x16"):
        load_model(static, {"x": (2, 4, 16, 16)})
    assert load_model(static, {"x": (2, 3, 16, 16)}).inputs[0].shape == (2, 3, 16, 16)


def test_shape_override_reaches_the_reference():
    """A static dim overridden with --shape: ONNX Runtime (the reference) runs the model at the new shape
    too."""
    import numpy as np

    from dynatune.compiler.execution import onnxruntime_outputs

    name = load_model(light_model("squeezenet")).inputs[0].name
    model = load_model(light_model("squeezenet"), {name: (2, 3, 224, 224)})
    assert model.inputs[0].shape == (2, 3, 224, 224)
    x = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    _, (out, *_) = onnxruntime_outputs(model, {name: x}, 1)
    assert out.shape[0] == 2


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(DynatuneError, match="not found"):
        load_model(str(tmp_path / "none.onnx"))
    junk = tmp_path / "junk.onnx"
    junk.write_text("this is not onnx at all\n" * 10)
    with pytest.raises(DynatuneError, match="not"):
        load_model(str(junk))


def test_truncated_file(tiny_onnx, tmp_path):
    data = open(tiny_onnx, "rb").read()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DynatuneError) as err:
        load_model(str(cut), {"x": (1, 3, 16, 16)})
    assert "\n" not in str(err.value)


def test_unsupported_op_names_op_and_node(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("FancyNewOp", ["x"], ["y"], name="my_node")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    p = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(DynatuneError, match="FancyNewOp.*my_node"):
        load_model(str(p))


def test_import_failure_names_node_not_a_stack_trace(tmp_path):
    """A Reshape whose target shape does not fit: TVM fails inside the converter."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])],
        [numpy_helper.from_array(np.array([7], dtype=np.int64), "s")],
    )
    p = tmp_path / "reshape.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(DynatuneError) as err:
        load_model(str(p))
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert "bad_reshape" in msg or "Reshape" in msg


def test_parse_shape():
    assert parse_shape("x=1x3x224x224") == ("x", (1, 3, 224, 224))
    assert parse_shape("a=b=2x2") == ("a=b", (2, 2))
    for bad in ["x", "x=", "x=1xz", "=1x2", "x=0x3"]:
        with pytest.raises(DynatuneError):
            parse_shape(bad)


def test_task_keys_are_stable_across_processes_and_models(tmp_path):
    """The same operator gets the same key in another process and in another version of the model."""
    a = make_tiny_onnx(str(tmp_path / "a.onnx"), batch=1, seed=0)
    b = make_tiny_onnx(str(tmp_path / "b.onnx"), batch=1, seed=1, extra_layer=True)
    code = (
        "import json,sys; from dynatune.model.importer import load_model; "
        "from dynatune.model.extract import extract_tasks;"
        "from dynatune.machine.target import make_target; t=make_target();"
        "print(json.dumps({x.name: x.key for x in extract_tasks(load_model(sys.argv[1]), t)}))"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [  # the three processes at once
        subprocess.Popen([sys.executable, "-c", code, p], stdout=subprocess.PIPE, text=True, env=env)
        for p in (a, a, b)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    keys = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert keys[0] == keys[1]
    shared = set(keys[0].values()) & set(keys[2].values())
    assert shared and len(set(keys[2].values()) - set(keys[0].values())) >= 1
