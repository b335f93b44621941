"""The served model on a GPU instance (run on the device machine): decode and ops on CUDA, outputs handed to
Triton as device tensors by DLPack, a bad item refused alone; the real server with a GPU instance."""

from __future__ import annotations

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


def test_the_real_server_on_a_gpu(tmp_path, reference):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    export(SPEC, tmp_path / "repo", kind="KIND_GPU", gpus=[0])
    http_port, grpc_port = free_ports(2)
    with TritonServer(tmp_path / "repo", http_port=http_port, grpc_port=grpc_port, options=gpu_options([0])) as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            for k in (0, 7):
                np.testing.assert_allclose(infer_grpc(client, IMAGES[k])[0], reference[k], atol=GPU_TOL)
        finally:
            client.close()
        assert "(GPU device 0)" in server.log.read_text()   # Triton's line for the instance it made
