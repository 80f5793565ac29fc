"""`tidelog delete-records --offset-json-file F`: delete the records below
an offset in partitions, as kafka-delete-records does. The file:
{"version": 1, "partitions": [{"topic": "t", "partition": 0, "offset": 42}]}
(offset -1: the high watermark, every committed record). Each partition's
log start offset moves there on every replica; whole segments below it are
deleted; reading below it gets OFFSET_OUT_OF_RANGE. Exit 1 when a partition
failed.
"""

from __future__ import annotations

import argparse

from tidelog.admin import AdminClient
from tidelog.cli._common import EXIT_ERROR, AddBootstrap
from tidelog.cli._json_files import read_offsets
from tidelog.errors import TidelogError


def register(sub: argparse._SubParsersAction, add_bootstrap: AddBootstrap) -> None:
    delete = sub.add_parser(
        "delete-records",
        help="delete records below an offset (kafka-delete-records)",
        description="Moves each partition's log start offset up to the file's offset (at most "
        "the high watermark; -1 means the high watermark) and deletes what is below it.",
    )
    delete.add_argument(
        "--offset-json-file",
        required=True,
        metavar="FILE",
        help='{"version": 1, "partitions": [{"topic": "t", "partition": 0, "offset": 42}]}',
    )
    delete.set_defaults(handler=_delete)
    add_bootstrap(delete)


def _delete(args: argparse.Namespace) -> int:
    offsets = read_offsets(args.offset_json_file)
    with AdminClient(bootstrap_servers=args.bootstrap_server) as admin:
        results = admin.delete_records(offsets, raise_errors=False)
    print("Records delete operation completed:")
    failed = 0
    for tp, result in sorted(results.items()):
        if isinstance(result, TidelogError):
            failed += 1
            print(f"partition: {tp.topic}-{tp.partition}\terror: {type(result).__name__}: {result}")
        else:
            print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {result}")
    return EXIT_ERROR if failed else 0
