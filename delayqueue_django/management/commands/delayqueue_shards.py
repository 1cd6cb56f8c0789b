"""``manage.py delayqueue_shards QUEUE [--retire LAYOUT]``: a queue's layouts and shards, and
taking a drained layout off the register once a reshard is over."""

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser
from redis.exceptions import RedisError

from delayqueue_django.core import registry
from delayqueue_django.engine.sharding.layouts import HELD
from delayqueue_django.engine.sharding.placement import MAX_SHARDS, parse_name, slot_of
from delayqueue_django.engine.sharding.stats import read_stats
from delayqueue_django.engine.sharding.store import ShardedStore, parts
from delayqueue_django.exceptions import QueueConfigurationError, UnknownQueue
from delayqueue_django.management.own_process import OwnProcessCommand
from delayqueue_django.outbox.table import bound_for_layout


def layout_number(text: str) -> int:
    # ArgumentTypeError: argparse shows its words (a ValueError only as "invalid value").
    try:
        layout = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 < layout <= MAX_SHARDS:
        raise argparse.ArgumentTypeError(f"a layout is 1 to {MAX_SHARDS}, not {layout}")
    return layout


class Command(OwnProcessCommand):
    help = (
        "Shows a queue's shards: the layout its SHARDS setting makes (live) and the earlier "
        "layouts still registered (draining), each shard with its counts. --retire takes a "
        "drained layout off the register, so that workers stop looking at its shards."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="The queue.")
        parser.add_argument(
            "--retire",
            type=layout_number,
            metavar="LAYOUT",
            help="Retire this earlier layout (an int, 1 to 128) if its shards hold nothing "
            "(for layout 1: no keyed message that only it finds on shard 0) and no outbox "
            "row waits to be relayed to them; only once no "
            "process runs with it as its SHARDS setting.",
        )

    def handle(self, *args: Any, queue: str, retire: int | None, **options: Any) -> None:
        try:
            chosen = registry.get_queue(queue)
        except (QueueConfigurationError, UnknownQueue) as error:
            raise CommandError(str(error)) from None
        self.refuse_memory_queues(
            [chosen], instead="Call call_command('delayqueue_shards') in that process."
        )
        store = chosen.store
        if not isinstance(store, ShardedStore):
            raise CommandError(f"queue {queue!r} has no shards")
        try:
            if retire is not None:
                self._retire(store, retire)
            self._show(store)
        except RedisError as error:
            raise CommandError(f"queue {queue!r}: Redis cannot be reached: {error}") from None

    def _retire(self, store: ShardedStore, layout: int) -> None:
        # The outbox first: a row a relay takes meanwhile is in the layout's shards before
        # its delete commits, so it is counted there if not here.
        relayed_later = bound_for_layout(store.keys.queue, layout)
        if relayed_later:
            raise CommandError(
                f"layout {layout} still has {relayed_later} outbox row(s) waiting to be "
                "relayed to its shards: retire it once a relay has written them and a worker "
                "has handled them."
            )
        try:
            holding = store.retire(layout)
        except ValueError as error:
            raise CommandError(str(error)) from None
        if holding:
            shards = "; ".join(
                f"{name}: " + ", ".join(f"{n} {state}" for state, n in held.items() if n)
                for name, held in holding.items()
            )
            raise CommandError(
                f"layout {layout} still holds messages ({shards}): a worker drains them; "
                "retire it once they are handled, or requeue or purge its dead letters."
            )
        self.stdout.write(f"layout {layout} retired")

    def _show(self, store: ShardedStore) -> None:
        store.refresh_layouts(force=True)
        draining = store.draining() or ()
        self.stdout.write(
            f"queue {store.keys.queue}: SHARDS {store.layout} (live)"
            + (f"; draining: {', '.join(map(str, draining))}" if draining else "")
        )
        header = f"{'shard':<8}{'role':<10}{'slot':>6}  " + "".join(f"{s:>12}" for s in HELD)
        self.stdout.write(f"{header}  tag")
        down: list[str] = []
        shards = parts(store)
        # One round trip per shard, and none more to a server that did not answer.
        read = read_stats(shards)
        for name, shard in shards.items():
            role = "live" if name == "0" or parse_name(name)[0] == store.layout else "draining"
            where = f"{name:<8}{role:<10}{slot_of(shard.keys):>6}  "
            stats = read[name]
            if isinstance(stats, Exception):
                # A master down hides its shards only, as in the other readers: the rest
                # are shown, and the command exits 1 once they are.
                down.append(name)
                self.stdout.write(f"{where}unreachable: {stats}")
                continue
            counts = "".join(f"{stats[state]:>12}" for state in HELD)
            self.stdout.write(f"{where}{counts}  {shard.keys.tag}")
        if down:
            raise CommandError(
                f"queue {store.keys.queue!r}: Redis cannot be reached for shard(s) "
                f"{', '.join(down)}"
            )
