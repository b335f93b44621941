"""Developer script: print what the GPU stack on this machine offers (versions, APIs ingest relies on)."""
import inspect
import io
import json
import os
import time

import numpy as np

out = {}
import torch
out["torch"] = torch.__version__
out["cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name()
try:
    import kvikio
    import kvikio.defaults
    out["kvikio"] = kvikio.__version__
    out["kvikio_compat"] = str(getattr(kvikio.defaults, "compat_mode", lambda: "?")())
    out["kvikio_defaults"] = [n for n in dir(kvikio.defaults) if not n.startswith("_")]
    out["kvikio_set_sig"] = str(inspect.signature(kvikio.defaults.set)) if hasattr(kvikio.defaults, "set") else None
    p = "/dev/shm/probe.bin"
    data = np.random.randint(0, 255, 1 << 20, dtype=np.uint8)
    data.tofile(p)
    buf = np.empty(1 << 20, np.uint8)
    with kvikio.CuFile(p, "r") as f:
        n = f.pread(buf, buf.nbytes, 0).get()
    out["kvikio_host_pread"] = [n, bool((buf == data).all())]
    import cupy
    d = cupy.empty(1 << 20, cupy.uint8)
    with kvikio.CuFile(p, "r") as f:
        n = f.pread(d, d.nbytes, 0).get()
    out["kvikio_dev_pread"] = [n, bool((cupy.asnumpy(d) == data).all())]
except Exception as e:  # noqa
    out["kvikio_err"] = repr(e)
try:
    from nvidia import nvimgcodec
    out["nvimgcodec"] = getattr(nvimgcodec, "__version__", "?")
    out["nvimgcodec_names"] = [n for n in dir(nvimgcodec) if not n.startswith("_")]
    out["Decoder_init"] = nvimgcodec.Decoder.__init__.__doc__
    out["decode_doc"] = nvimgcodec.Decoder.decode.__doc__
    out["CodeStream_attrs"] = [n for n in dir(nvimgcodec.CodeStream) if not n.startswith("_")]
    out["Image_attrs"] = [n for n in dir(nvimgcodec.Image) if not n.startswith("_")]
    out["DecodeParams_doc"] = nvimgcodec.DecodeParams.__init__.__doc__
    from PIL import Image
    im = Image.new("RGB", (640, 480))
    arr = (np.random.rand(480, 640, 3) * 255).astype(np.uint8)
    b = io.BytesIO(); Image.fromarray(arr).save(b, "JPEG", quality=90); jb = b.getvalue()
    b = io.BytesIO(); Image.fromarray(arr).save(b, "PNG"); pb = b.getvalue()
    b = io.BytesIO(); Image.fromarray(arr).save(b, "JPEG", quality=90, progressive=True); prog = b.getvalue()
    dec = nvimgcodec.Decoder()
    cs = nvimgcodec.CodeStream(jb)
    out["cs_info"] = {k: str(getattr(cs, k, None)) for k in ("height", "width", "num_channels", "codec_name", "dtype")}
    res = dec.decode([jb, pb, prog, b"garbage"])
    out["decode_results"] = [None if r is None else (r.shape, str(r.dtype), getattr(r, "buffer_kind", None).__repr__()) for r in res]
    r = res[0]
    out["cai"] = str(r.__cuda_array_interface__)
    for bk in ("HW_GPU_ONLY", "HYBRID_CPU_GPU", "GPU_ONLY", "CPU_ONLY"):
        try:
            d2 = nvimgcodec.Decoder(backend_kinds=[getattr(nvimgcodec.BackendKind, bk)])
            rr = d2.decode([jb, prog])
            out["backend_" + bk] = [None if x is None else x.shape for x in rr]
        except Exception as e:
            out["backend_" + bk] = repr(e)
    sub = cs.get_sub_code_stream(region=nvimgcodec.Region(start=(10, 20), end=(110, 220)))
    rr = dec.decode([sub])
    t = torch.as_tensor(rr[0], device="cuda")
    full = torch.as_tensor(dec.decode([jb])[0], device="cuda")
    out["roi"] = [list(t.shape), float((t.float() - full[10:110, 20:220].float()).abs().mean())]
    s = torch.cuda.Stream()
    rr = dec.decode([jb] * 8, cuda_stream=s.cuda_stream)
    out["stream_decode"] = len(rr)
    try:
        p = nvimgcodec.DecodeParams(apply_exif_orientation=True, color_spec=nvimgcodec.ColorSpec.RGB)
        out["params_ok"] = True
    except Exception as e:
        out["params_err"] = repr(e)
    # speed: 256 x 640x480 jpeg
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 2:
        dec.decode([jb] * 256, cuda_stream=s.cuda_stream); s.synchronize(); n += 256
    out["hw_rate_640x480"] = n / (time.perf_counter() - t0)
except Exception:  # noqa: BLE001
    import traceback
    out["nvimgcodec_err"] = traceback.format_exc()
try:
    import cupy
    out["cupy"] = cupy.__version__
except Exception as e:  # noqa: BLE001 - a probe reports, never stops
    out["cupy_err"] = repr(e)
for m in ("torchvision", "skimage", "sklearn", "cv2", "pynvml"):
    try:
        out[m] = __import__(m).__version__
    except Exception as e:
        out[m] = "missing " + repr(e)
out["nproc"] = os.cpu_count()
print(json.dumps(out, indent=1, default=str))
