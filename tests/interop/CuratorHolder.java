// Apache Curator's InterProcessMutex on a lock path, for tests/curator_interop.rs.
// usage: java -cp <curator jars> CuratorHolder.java CONNECT PATH WAIT_MS HOLD_MS
// Prints CONNECTED, then ACQUIRED or TIMEOUT, then RELEASING and RELEASED, one line each.
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorHolder {
    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1];
        long waitMs = Long.parseLong(args[2]), holdMs = Long.parseLong(args[3]);
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryOneTime(100))) {
            client.start();
            client.blockUntilConnected();
            InterProcessMutex mutex = new InterProcessMutex(client, path);
            System.out.println("CONNECTED");
            if (!mutex.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                System.out.println("TIMEOUT");
                return;
            }
            System.out.println("ACQUIRED");
            Thread.sleep(holdMs);
            System.out.println("RELEASING");
            mutex.release();
            System.out.println("RELEASED");
        }
    }
}
