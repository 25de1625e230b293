"""`bigbatch data pack` and `bigbatch data locate`."""

from __future__ import annotations

import argparse
import json


def add_commands(commands) -> None:
    command = commands.add_parser(
        "data", help="prepare data sets", description="Prepare data sets."
    )
    actions = command.add_subparsers(title="actions", metavar="ACTION")
    pack = actions.add_parser(
        "pack",
        help="pre-resize an image folder into memory-mappable shards",
        description="Pre-resize SRC/{train,val}/<class>/<images> into shards under DST, "
        "read with --dataset packed --data DST.",
    )
    pack.add_argument("src", help="image folder with train/ and val/")
    pack.add_argument("dst", help="output folder")
    pack.add_argument("--short-side", type=int, default=256, help="shorter side after resizing")
    pack.add_argument(
        "--encoding",
        choices=("jpeg", "raw"),
        default="jpeg",
        help="jpeg: re-encoded (small files); raw: uint8 pixels (fastest reads)",
    )
    pack.add_argument("--quality", type=int, default=90, help="JPEG quality")
    pack.add_argument(
        "--format",
        choices=("packed", "webdataset"),
        default="packed",
        help="packed: bigbatch shards (--dataset packed); webdataset: DST/{train,val}-NNNN.tar "
        "of reduced-size JPEGs (--dataset webdataset)",
    )
    pack.add_argument("--workers", type=int, default=None, help="decoding processes")
    pack.add_argument("--overwrite", action="store_true", help="replace splits packed before")
    pack.set_defaults(handler=run_data_pack)
    locate = actions.add_parser("locate", help="show where Fashion-MNIST is found (verified)")
    locate.add_argument("--data", help="a folder to try first")
    locate.set_defaults(handler=run_data_locate)


def run_data_pack(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from bigbatch.data.pack import pack_imagefolder
    from bigbatch.data.webdataset_write import write_webdataset

    common = dict(short_side=args.short_side, quality=args.quality, workers=args.workers,
                  overwrite=args.overwrite)
    if args.format == "webdataset":
        summary = write_webdataset(args.src, args.dst, **common)
    else:
        summary = pack_imagefolder(args.src, args.dst, encoding=args.encoding, **common)
    print(json.dumps(asdict(summary), default=str))
    return 0


def run_data_locate(args: argparse.Namespace) -> int:
    from bigbatch.data.fashion_mnist import locate_fashion_mnist

    print(locate_fashion_mnist(args.data))
    return 0
