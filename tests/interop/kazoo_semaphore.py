# kazoo's Semaphore on a path, for tests/interop/semaphore_interop.rs (why it cannot share a path with
# Curator's and our InterProcessSemaphoreV2).
# usage: python3 kazoo_semaphore.py CONNECT PATH MAX_LEASES TIMEOUT_S
# Prints ACQUIRED or TIMEOUT, then CHILDREN <the children of PATH, comma-separated>, then releases.
import sys

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout

connect, path, max_leases, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
client = KazooClient(hosts=connect)
client.start()
semaphore = client.Semaphore(path, max_leases=max_leases)
try:
    got = semaphore.acquire(timeout=timeout)
except LockTimeout:
    got = False
print("ACQUIRED" if got else "TIMEOUT", flush=True)
print("CHILDREN " + ",".join(sorted(client.get_children(path))), flush=True)
if got:
    semaphore.release()
client.stop()
