// Apache Curator's InterProcessMutex on a lock path, for tests/interop/curator_interop.rs and
// tests/interop/mixed_interop.rs.
// usage: java -cp <curator jars> CuratorHolder.java CONNECT PATH WAIT_MS HOLD_MS
// Prints CONNECTED, then ACQUIRED or TIMEOUT, then RELEASING and RELEASED, one line each.
//
// At the grant, the lock directory is listed again on the granted session: every lock node with
// a lower sequence number (Curator's, ours, kazoo's) must be gone by then. If one is not, the
// line is "ACQUIRED AHEAD <names>" instead of "ACQUIRED": the lock was granted while a node
// queued ahead still existed (an overlap with its holder, or a grant out of queue order).
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorHolder {
    // A lock node of any of the three implementations: Curator's and ours (..lock-<seq>),
    // kazoo's (..__lock__<seq>).
    static final Pattern LOCK_NODE = Pattern.compile("(?:lock-|__lock__)(-?\\d{10})$");

    // Exposes the path of our lock node.
    static class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework client, String path) {
            super(client, path);
        }

        String node() {
            return getLockPath();
        }
    }

    static long sequence(String name) {
        Matcher m = LOCK_NODE.matcher(name);
        return m.find() ? Long.parseLong(m.group(1)) : Long.MAX_VALUE;
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1];
        long waitMs = Long.parseLong(args[2]), holdMs = Long.parseLong(args[3]);
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryOneTime(100))) {
            client.start();
            client.blockUntilConnected();
            Mutex mutex = new Mutex(client, path);
            System.out.println("CONNECTED");
            if (!mutex.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                System.out.println("TIMEOUT");
                return;
            }
            long ours = sequence(mutex.node());
            List<String> ahead = new ArrayList<>();
            for (String child : client.getChildren().forPath(path)) {
                if (sequence(child) < ours) {
                    ahead.add(child);
                }
            }
            Collections.sort(ahead);
            System.out.println(ahead.isEmpty() ? "ACQUIRED" : "ACQUIRED AHEAD " + String.join(",", ahead));
            Thread.sleep(holdMs);
            System.out.println("RELEASING");
            mutex.release();
            System.out.println("RELEASED");
        }
    }
}
