"""Developer script (device machine): what nvJPEG2000 called directly spends on a JPEG 2000 image at each
resolution level, one image after another on one thread.

For the first ``--images`` files of DATA_DIR (``.jp2``/``.j2k``, e.g. bench_codecs' ``j2k_large`` set), per warp
step (None: full resolution; 2, 4, 8, 16: the level `nvjpeg2k.choose_level` picks, 1 to 4): the host-side parse
and planning alone (`nvjpeg2k.inspect`), the whole image decoded twice (queued back to back, one wait at the
end), once with a wait after each image, and a 512 x 512 region at (256, 256) (the tiles it touches), each as
milliseconds per image.

Usage: python dev/nvjpeg2k_levels.py DATA_DIR [--images 64] [--json OUT.json]
"""

import argparse
import glob
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import torch
    from ingest.decode import nvjpeg2k as nj
    files = sorted(glob.glob(f"{args.data}/*/*.jp2") + glob.glob(f"{args.data}/*/*.j2k"))[:args.images]
    datas = [open(f, "rb").read() for f in files]
    dec = nj.Decoder(torch.device("cuda:0"))
    stream = torch.cuda.current_stream()
    parse_slot = dec._new_slot()

    def host(step):
        t = time.perf_counter()
        for d in datas:
            nj.inspect(dec.lib, dec.handle, parse_slot.bitstream, d, "x", None, step)
        return (time.perf_counter() - t) / len(datas) * 1e3

    def run(step, roi=None, sync_each=False):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for d in datas:
            dec.decode(d, "x", roi, step, stream)
            if sync_each:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / len(datas) * 1e3

    run(None)   # warm-up
    rows = []
    for step in (None, 2.0, 4.0, 8.0, 16.0):
        row = {"step": step, "host_parse_ms": host(step), "whole_ms": [run(step), run(step)],
               "whole_synced_ms": run(step, sync_each=True), "region512_ms": run(step, (256, 256, 768, 768))}
        rows.append({k: (round(v, 2) if isinstance(v, float) else [round(x, 2) for x in v] if isinstance(v, list)
                         else v) for k, v in row.items()})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"probe": "nvjpeg2k_levels", "data": args.data, "images": len(datas),
                       "device": torch.cuda.get_device_name(0), "rows": rows,
                       "declined": dict(dec.declined)}, f, indent=1)


if __name__ == "__main__":
    main()
