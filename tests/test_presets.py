"""Per-tensor allocation presets (pyobmem/launcher.py tensor_presets): swap mode and --tensor-blocks
make each framework allocate every tensor with the driver's stream-ordered allocator; the user's
own settings win. TensorFlow is not installed anywhere the tests run: its preset is checked here
only, as the variable set."""

from helpers import PY, clean_env, pyobmem
from test_cli import shim  # noqa: F401  (the fixture)

from pyobmem.capture import read_capture
from pyobmem.commands import summary
from pyobmem.launcher import tensor_presets

ALL = {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync", "XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async",
       "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_GPU_ALLOCATOR": "cuda_malloc_async"}


def test_nothing_set_gets_every_framework_preset():
    assert tensor_presets({}) == (ALL, [])


def test_a_users_pytorch_options_keep_theirs_and_get_the_backend():
    applied, limited = tensor_presets({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,"})
    assert applied["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,backend:cudaMallocAsync" and not limited
    # PYTORCH_ALLOC_CONF is the one torch reads first: merged there, the other left alone
    applied, _ = tensor_presets({"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6",
                                 "PYTORCH_CUDA_ALLOC_CONF": "x:1"})
    assert applied["PYTORCH_ALLOC_CONF"] == "garbage_collection_threshold:0.6,backend:cudaMallocAsync"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in applied


def test_a_backend_the_user_chose_is_kept_with_one_line():
    applied, limited = tensor_presets({"PYTORCH_CUDA_ALLOC_CONF": "backend:native,expandable_segments:True"})
    assert not any(k.startswith("PYTORCH") for k in applied)
    assert limited == ["PYTORCH_CUDA_ALLOC_CONF sets backend:native; PyTorch's blocks are its segments, and "
                       "swapping is limited to what the driver sees of them"]
    assert tensor_presets({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}) == (
        {k: v for k, v in ALL.items() if not k.startswith("PYTORCH")}, [])


def test_jax_and_tensorflow_settings_of_the_user_win():
    applied, limited = tensor_presets({"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc", "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                                       "TF_GPU_ALLOCATOR": "cuda_malloc_async"})
    assert applied == {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}
    assert limited == ["XLA_PYTHON_CLIENT_ALLOCATOR=bfc is kept; swapping is limited to what the driver sees of "
                       "that framework's blocks"]


def test_a_users_xla_allocator_keeps_its_preallocation():
    # XLA_PYTHON_CLIENT_MEM_FRACTION sizes the BFC arena the user asked for: no PREALLOCATE=false under it
    applied, limited = tensor_presets({"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.05"})
    assert not any(k.startswith("XLA_") for k in applied), applied
    assert limited == ["XLA_PYTHON_CLIENT_ALLOCATOR=bfc is kept; swapping is limited to what the driver sees of "
                       "that framework's blocks"]
    assert tensor_presets({"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"})[0]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_tensor_blocks_trace_records_and_names_the_presets(tmp_path, shim):  # noqa: F811
    code = "import os; print(os.environ['PYTORCH_CUDA_ALLOC_CONF'], os.environ['XLA_PYTHON_CLIENT_ALLOCATOR'])"
    env = clean_env(shim["env"], drop=("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "TF_GPU_ALLOCATOR"))
    env = {k: v for k, v in env.items() if not k.startswith("XLA_PYTHON_CLIENT_")}
    proc = pyobmem("run", "--tensor-blocks", "-o", "c.pyobmem", PY, "-c", code, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "backend:cudaMallocAsync cuda_async"
    said = [line for line in proc.stderr.splitlines() if line.startswith("pyobmem: presets, every tensor its own block: ")]
    assert said == ["pyobmem: presets, every tensor its own block: " + ", ".join(f"{k}={v}" for k, v in ALL.items())
                    + " (PyTorch then refuses memory snapshots and CUDA-graph trees); --no-presets turns them off"]
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.meta["presets"] == ALL and cap.meta["blocks"] == "tensor"
    text = summary.format_summary(summary.summarize(cap))
    assert "backend:cudaMallocAsync (preset)" in text and "tensors (per-tensor allocation presets)" in text
    # --no-presets: none, and the blocks are the allocator's
    proc = pyobmem("run", "-f", "-q", "--tensor-blocks", "--no-presets", "-o", "c.pyobmem", PY, "-c", "pass",
                   cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    cap = read_capture(str(tmp_path / "c.pyobmem"))
    assert cap.meta["presets"] == {} and cap.meta["blocks"] == "allocator"
