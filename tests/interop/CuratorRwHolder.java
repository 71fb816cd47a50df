// Apache Curator's InterProcessReadWriteLock on a lock path, for tests/interop/rw_interop.rs.
// usage: java -cp <curator jars> CuratorRwHolder.java CONNECT PATH MODE WAIT_MS HOLD_MS [MARKER_DIR]
//
// MODE read or write: prints CONNECTED, then ACQUIRED or TIMEOUT, then RELEASING and RELEASED.
// MODE downgrade: acquires the write lock, then the read lock (granted at once to the thread that
// holds the write lock), releases the write lock and holds the read lock: prints CONNECTED, then
// WRITE_ACQUIRED (or TIMEOUT), READ_ACQUIRED, WRITE_RELEASED, RELEASING and RELEASED.
// MODE downgrade-on-cue: the same, but waits for a line on standard input after WRITE_ACQUIRED
// before it acquires the read lock.
// It holds for HOLD_MS (the read lock, for downgrade); a negative HOLD_MS holds until a line (or
// the end) on standard input.
//
// At each grant, the lock directory is listed again on the granted session: a node of another
// session that must be gone by then — for a write grant any node with a lower sequence number,
// for a read grant a write node with a lower one — turns the line into "<LINE> AHEAD <names>".
//
// With MARKER_DIR, an EPHEMERAL node <MARKER_DIR>/read-<pid> or write-<pid> exists while the
// read or write lock is held (created before the grant's line is printed, deleted before the
// release's RELEASING or WRITE_RELEASED), so a test can list who is inside.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.data.Stat;

public class CuratorRwHolder {
    static final Pattern RW_NODE = Pattern.compile("(__READ__|__WRIT__)(-?\\d{10})$");

    static CuratorFramework client;
    static String path;
    static String markers;
    static final long PID = ProcessHandle.current().pid();

    // The nodes of other sessions that must be gone when our `kind` node (__READ__ or __WRIT__)
    // is granted: for a write node every node ahead, for a read node the write nodes ahead.
    static List<String> ahead(String kind) throws Exception {
        long session = client.getZookeeperClient().getZooKeeper().getSessionId();
        List<String> children = client.getChildren().forPath(path);
        long ours = Long.MAX_VALUE;
        for (String child : children) {
            Matcher m = RW_NODE.matcher(child);
            Stat stat = client.checkExists().forPath(path + "/" + child);
            if (m.find() && m.group(1).equals(kind) && stat != null && stat.getEphemeralOwner() == session) {
                ours = Long.parseLong(m.group(2));
            }
        }
        List<String> ahead = new ArrayList<>();
        for (String child : children) {
            Matcher m = RW_NODE.matcher(child);
            if (!m.find() || Long.parseLong(m.group(2)) >= ours) {
                continue;
            }
            if (kind.equals("__READ__") && !m.group(1).equals("__WRIT__")) {
                continue;
            }
            Stat stat = client.checkExists().forPath(path + "/" + child);
            if (stat != null && stat.getEphemeralOwner() != session) {
                ahead.add(child);
            }
        }
        Collections.sort(ahead);
        return ahead;
    }

    // Enters the marker directory as `role` and prints `line`, with the nodes ahead if any.
    static void granted(String line, String kind, String role) throws Exception {
        List<String> ahead = ahead(kind);
        if (markers != null) {
            client.create().creatingParentContainersIfNeeded().withMode(CreateMode.EPHEMERAL)
                .forPath(markers + "/" + role + "-" + PID);
        }
        System.out.println(ahead.isEmpty() ? line : line + " AHEAD " + String.join(",", ahead));
    }

    static void leave(String role) throws Exception {
        if (markers != null) {
            client.delete().forPath(markers + "/" + role + "-" + PID);
        }
    }

    static final BufferedReader STDIN = new BufferedReader(new InputStreamReader(System.in));

    static void hold(long holdMs) throws Exception {
        if (holdMs < 0) {
            STDIN.readLine();
        } else {
            Thread.sleep(holdMs);
        }
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], mode = args[2];
        path = args[1];
        long waitMs = Long.parseLong(args[3]), holdMs = Long.parseLong(args[4]);
        markers = args.length > 5 ? args[5] : null;
        try (CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryOneTime(100))) {
            client = c;
            client.start();
            client.blockUntilConnected();
            InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
            System.out.println("CONNECTED");
            switch (mode) {
                case "read":
                case "write": {
                    boolean write = mode.equals("write");
                    InterProcessMutex lock = write ? rw.writeLock() : rw.readLock();
                    if (!lock.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                        System.out.println("TIMEOUT");
                        return;
                    }
                    granted("ACQUIRED", write ? "__WRIT__" : "__READ__", mode);
                    hold(holdMs);
                    leave(mode);
                    System.out.println("RELEASING");
                    lock.release();
                    System.out.println("RELEASED");
                    break;
                }
                case "downgrade":
                case "downgrade-on-cue": {
                    InterProcessMutex write = rw.writeLock(), read = rw.readLock();
                    if (!write.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                        System.out.println("TIMEOUT");
                        return;
                    }
                    granted("WRITE_ACQUIRED", "__WRIT__", "write");
                    if (mode.equals("downgrade-on-cue")) {
                        STDIN.readLine();
                    }
                    if (!read.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                        throw new IllegalStateException("the read lock was not granted to the write lock's holder");
                    }
                    granted("READ_ACQUIRED", "__READ__", "read");
                    leave("write");
                    write.release();
                    System.out.println("WRITE_RELEASED");
                    hold(holdMs);
                    leave("read");
                    System.out.println("RELEASING");
                    read.release();
                    System.out.println("RELEASED");
                    break;
                }
                default:
                    throw new IllegalArgumentException("MODE must be read, write, downgrade or downgrade-on-cue: " + mode);
            }
        }
    }
}
