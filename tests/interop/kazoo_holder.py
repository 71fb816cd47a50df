# kazoo's Lock (kazoo 2.8, Debian's python3-kazoo) on a lock path, for tests/interop/mixed_interop.rs.
# usage: /usr/bin/python3 kazoo_holder.py CONNECT PATH WAIT_MS HOLD_MS [--no-extra-patterns]
# Prints CONNECTED, then ACQUIRED or TIMEOUT, then RELEASING and RELEASED, one line each (the
# protocol of CuratorHolder.java).
#
# The lock is built with extra_lock_patterns=["-lock-"], so that it queues behind Curator-format
# nodes (_c_<uuid>-lock-<seq>); --no-extra-patterns leaves them out (kazoo's default), and then
# it sees only its own <hex uuid>__lock__<seq> nodes.
#
# At the grant, the lock directory is listed again on the granted session: every lock node with
# a lower sequence number (Curator's, ours, kazoo's) must be gone by then. If one is not, the
# line is "ACQUIRED AHEAD <names>" instead of "ACQUIRED": the lock was granted while a node
# queued ahead still existed (an overlap with its holder, or a grant out of queue order).
import os
import re
import sys
import time

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout
from kazoo.recipe.lock import Lock

# A lock node of any of the three implementations: Curator's and ours (..lock-<seq>), kazoo's
# (..__lock__<seq>); the sequence is the 10-digit (or negative, after overflow) counter.
LOCK_NODE = re.compile(r"(?:lock-|__lock__)(-?\d{10})$")


def say(line):
    print(line, flush=True)


def nodes_ahead(client, path, own):
    ours = int(LOCK_NODE.search(own).group(1))
    ahead = []
    for child in client.get_children(path):
        match = LOCK_NODE.search(child)
        if match is not None and int(match.group(1)) < ours:
            ahead.append(child)
    return sorted(ahead)


def main():
    args = [a for a in sys.argv[1:] if a != "--no-extra-patterns"]
    extra = () if "--no-extra-patterns" in sys.argv[1:] else ("-lock-",)
    connect, path, wait_ms, hold_ms = args[0], args[1], int(args[2]), int(args[3])
    client = KazooClient(hosts=connect, timeout=10.0)
    client.start(timeout=60)
    try:
        lock = Lock(client, path, "kazoo-holder-%d" % os.getpid(), extra_lock_patterns=extra)
        say("CONNECTED")
        try:
            acquired = lock.acquire(timeout=wait_ms / 1000.0)
        except LockTimeout:
            acquired = False
        if not acquired:
            say("TIMEOUT")
            return
        ahead = nodes_ahead(client, path, lock.node)
        say("ACQUIRED AHEAD " + ",".join(ahead) if ahead else "ACQUIRED")
        time.sleep(hold_ms / 1000.0)
        say("RELEASING")
        lock.release()
        say("RELEASED")
    finally:
        client.stop()
        client.close()


if __name__ == "__main__":
    main()
