"""Elastic resume for real, under torchrun: a job of N ranks takes some steps and saves rank 0's
`Loader.state_dict()`; a job of M ranks loads it on every rank and finishes the epoch; the samples of both
jobs (gathered over torch.distributed) must cover the dataset exactly once. Used on a 2-GPU machine:

    python dev/elastic_torchrun.py make --data /dev/shm/el --n 1000
    torchrun --nproc_per_node 2 dev/elastic_torchrun.py run --data /dev/shm/el --steps 3 --save /dev/shm/s21.pt --record /dev/shm/a21.json
    torchrun --nproc_per_node 1 dev/elastic_torchrun.py run --data /dev/shm/el --load /dev/shm/s21.pt --record /dev/shm/b21.json
    python dev/elastic_torchrun.py check --n 1000 --logs /dev/shm/a21.json /dev/shm/b21.json --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def make(args) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from conftest import make_image_folder
    from pathlib import Path
    per = args.n // 10
    make_image_folder(Path(args.data), {f"c{k}": per for k in range(10)}, size=(64, 80))


def run(args) -> None:
    import torch
    import torch.distributed as dist
    import ingest
    from ingest.ops import Flip, Normalize, RandomResizedCrop
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    loader = ingest.Loader(args.data, batch_size=args.batch, device="cuda", shuffle=True, seed=3, output="dict",
                           num_workers=0, ops=[RandomResizedCrop(32), Flip(), Normalize(mean=[0] * 3, std=[1] * 3)])
    if args.load:
        loader.load_state_dict(torch.load(args.load))
    got, steps = [], 0
    for batch in loader:
        real = batch["indices"][~batch["is_pad"]].tolist()
        got += real
        steps += 1
        dist.barrier()   # a synchronous step, as DDP's
        if args.steps and steps == args.steps:
            break
    state = loader.state_dict()
    if rank == 0 and args.save:
        torch.save(state, args.save)
    everyone = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "indices": got, "steps": steps,
                                      "device": torch.cuda.get_device_name(), "state": state})
    if rank == 0:
        with open(args.record, "w") as f:
            json.dump({"world": world, "ranks": everyone}, f)
    dist.destroy_process_group()


def check(args) -> int:
    runs = [json.load(open(p)) for p in args.logs]
    seen = [i for r in runs for rank in r["ranks"] for i in rank["indices"]]
    result = {"jobs": [{"world": r["world"], "samples": sum(len(x["indices"]) for x in r["ranks"]),
                        "steps": [x["steps"] for x in r["ranks"]]} for r in runs],
              "devices": sorted({x["device"] for r in runs for x in r["ranks"]}),
              "total": len(seen), "unique": len(set(seen)), "expected": args.n,
              "exactly_once": sorted(seen) == list(range(args.n))}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0 if result["exactly_once"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--data", required=True)
    m.add_argument("--n", type=int, default=1000)
    r = sub.add_parser("run")
    r.add_argument("--data", required=True)
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the whole epoch)")
    r.add_argument("--save", help="write rank 0's state_dict here")
    r.add_argument("--load", help="resume from this state_dict")
    r.add_argument("--record", required=True)
    c = sub.add_parser("check")
    c.add_argument("--n", type=int, required=True)
    c.add_argument("--logs", nargs="+", required=True)
    c.add_argument("--out", required=True)
    args = p.parse_args()
    return {"make": make, "run": run, "check": check}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
