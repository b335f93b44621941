"""The served model on a GPU instance (run on the device machine): decode and ops on CUDA, outputs handed to
Triton as device tensors by DLPack, a bad item refused alone; the real server with a GPU instance, where a user
model gets the batch on the GPU and Triton's output tensors hold the very device memory handed to them."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import requires_cuda
from test_serve import (BAD, IMAGES, SPEC, FakeRequest, exported_model, free_ports, infer_grpc, reference,  # noqa: F401
                        user_model)
from ingest.serve import TritonServer, export
from ingest.serve.server import gpu_options

pytestmark = [pytest.mark.gpu, requires_cuda]

#: nvImageCodec and the CUDA warp against libjpeg-turbo and the CPU warp: a few pixel levels (of std 57).
GPU_TOL = 4.0 / 57.0


def test_a_gpu_instance_answers_with_device_tensors(tmp_path, monkeypatch, reference):
    model = exported_model(tmp_path, monkeypatch, model=f"test_serve:{user_model.__name__}", kind="GPU")
    assert model.preprocessor.device.type == "cuda"
    responses = model.execute([FakeRequest(IMAGES[0]), FakeRequest(BAD["not an image"][0]), FakeRequest(IMAGES[1])])
    assert "refused" in responses[1].error
    for k, r in ((0, responses[0]), (1, responses[2])):
        images, output = r.tensors["IMAGES"], r.tensors["OUTPUT"]
        assert images.is_cuda and output.is_cuda   # never through host memory
        np.testing.assert_allclose(images.cpu().numpy()[0], reference[k], atol=GPU_TOL)
        np.testing.assert_allclose(output.cpu().numpy()[0], images.cpu().numpy()[0].mean(axis=(1, 2)), atol=1e-5)


def test_a_gpu_instance_with_host_outputs_answers_with_pinned_host_tensors(tmp_path, monkeypatch, reference):
    """output_memory="host": the batch's images and model rows leave in host memory, equal to the device ones."""
    model = exported_model(tmp_path, monkeypatch, model=f"test_serve:{user_model.__name__}", kind="GPU",
                           output_memory="host")
    assert model.host_outputs
    requests = [FakeRequest(IMAGES[0]), FakeRequest(BAD["not an image"][0]), FakeRequest(IMAGES[1])]
    responses = model.execute(requests)
    assert "refused" in responses[1].error
    for k, r in ((0, responses[0]), (1, responses[2])):
        images, output = r.tensors["IMAGES"], r.tensors["OUTPUT"]
        assert not images.is_cuda and not output.is_cuda and images.is_pinned()
        np.testing.assert_allclose(images.numpy()[0], reference[k], atol=GPU_TOL)
        np.testing.assert_allclose(output.numpy()[0], images.numpy()[0].mean(axis=(1, 2)), atol=1e-5)


def test_a_float16_spec_on_a_gpu_instance_answers_float16_device_tensors(tmp_path, monkeypatch):
    """Normalize(dtype=float16) (bench_serve's serve_fp16): FP16 device tensors, the GPU loader's images."""
    import sys
    import torch
    from ingest import Loader
    from ingest.ops import Normalize, dumps
    import test_serve
    ops = [*test_serve.OPS[:2], Normalize(mean=[124.0, 116.0, 104.0], std=[58.0, 57.0, 57.0], dtype=torch.float16)]
    monkeypatch.setattr(sys.modules["test_serve"], "SPEC", dumps(ops))
    model = exported_model(tmp_path, monkeypatch, kind="GPU")
    responses = model.execute([FakeRequest(IMAGES[k]) for k in (0, 7)])
    with Loader([IMAGES[0], IMAGES[7]], batch_size=2, ops=ops, device="cuda") as loader:
        (images, _), = list(loader)
    for r, row in zip(responses, images):
        got = r.tensors["IMAGES"]
        assert got.is_cuda and got.dtype == torch.float16
        torch.testing.assert_close(got[0], row, atol=2e-3, rtol=0)


def test_outputs_of_different_shapes_go_to_the_host_one_by_one():
    import torch
    from ingest.serve.backend import _host_rows
    rows = [torch.arange(6.0, device="cuda").reshape(2, 3), torch.arange(4.0, device="cuda")]
    host = _host_rows(rows)
    torch.cuda.current_stream().synchronize()
    assert all(h.is_pinned() for h in host) and [h.tolist() for h in host] == [r.tolist() for r in rows]


@pytest.mark.parametrize("output_memory,instances", [("device", 1), ("host", 1), ("device", 2)])
def test_the_real_server_on_a_gpu(tmp_path, reference, output_memory, instances):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    export(SPEC, tmp_path / "repo", kind="KIND_GPU", gpus=[0], output_memory=output_memory, instances=instances)
    http_port, grpc_port = free_ports(2)
    with TritonServer(tmp_path / "repo", http_port=http_port, grpc_port=grpc_port, options=gpu_options([0])) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            for k in (0, 7):
                np.testing.assert_allclose(infer_grpc(client, IMAGES[k])[0], reference[k], atol=GPU_TOL)
        finally:
            client.close()
        assert server.log.read_text().count("(GPU device 0)") >= instances   # Triton's line per instance made


#: A user model for the real server that notes, from inside the backend stub, the device of the batch it gets
#: and, for each output, the device memory handed to ``pb_utils.Tensor.from_dlpack`` and the memory the Triton
#: tensor made from it holds (its own ``to_dlpack``): the same pointer when nothing was copied.
RECORDER = """
import json, os, sys
import torch, torch.utils.dlpack


def note(**fields):
    with open(os.environ["INGEST_TEST_RECORD"], "a") as f:
        f.write(json.dumps(fields) + "\\n")


class WatchedTensor:
    real = None

    @classmethod
    def from_dlpack(cls, name, capsule):
        source = torch.utils.dlpack.from_dlpack(capsule)
        tensor = cls.real.from_dlpack(name, torch.utils.dlpack.to_dlpack(source))
        held = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        note(kind="output", name=name, source_device=str(source.device), source_ptr=source.data_ptr(),
             triton_on_cpu=bool(tensor.is_cpu()), triton_ptr=held.data_ptr())
        return tensor


def net(batch):
    pb = sys.modules["triton_python_backend_utils"]
    if pb.Tensor is not WatchedTensor:
        try:
            WatchedTensor.real, pb.Tensor = pb.Tensor, WatchedTensor
        except Exception as err:
            note(kind="unwatched", error=repr(err))
    note(kind="model", device=str(batch.device), ptr=batch.data_ptr(), shape=list(batch.shape))
    return batch.mean(dim=(2, 3))
"""


def test_the_served_model_gets_the_batch_on_the_gpu_and_triton_keeps_its_memory(tmp_path, monkeypatch, reference):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    (tmp_path / "recorder.py").write_text(RECORDER)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("INGEST_TEST_RECORD", str(record))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    export(SPEC, tmp_path / "repo", kind="KIND_GPU", gpus=[0], model="recorder:net")
    http_port, grpc_port = free_ports(2)
    with TritonServer(tmp_path / "repo", http_port=http_port, grpc_port=grpc_port, options=gpu_options([0])) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            x = np.frombuffer(IMAGES[2], np.uint8)[None]
            tensor = grpcclient.InferInput("ENCODED", list(x.shape), "UINT8")
            tensor.set_data_from_numpy(x)
            result = client.infer("preprocess", [tensor], outputs=[grpcclient.InferRequestedOutput("IMAGES"),
                                                                   grpcclient.InferRequestedOutput("OUTPUT")])
        except Exception:
            print(server.log_tail(80))
            raise
        finally:
            client.close()
    images = result.as_numpy("IMAGES")
    np.testing.assert_allclose(images[0], reference[2], atol=GPU_TOL)
    np.testing.assert_allclose(result.as_numpy("OUTPUT")[0], images[0].mean(axis=(1, 2)), atol=1e-4)
    notes = [json.loads(line) for line in record.read_text().splitlines()]
    calls = [n for n in notes if n["kind"] == "model"]
    outputs = {n["name"]: n for n in notes if n["kind"] == "output"}
    assert calls and all(n["device"] == "cuda:0" and n["shape"] == [1, 3, 32, 32] for n in calls), notes
    assert set(outputs) == {"IMAGES", "OUTPUT"}, notes
    for n in outputs.values():
        assert n["source_device"] == "cuda:0" and not n["triton_on_cpu"], notes
        assert n["triton_ptr"] == n["source_ptr"], notes   # Triton's tensor is the batch's memory: no copy
