// Apache Curator's lock family on a path, for tests/interop/semaphore_interop.rs.
// usage: java -cp <curator jars> CuratorSemaphoreHolder.java CONNECT PATH MODE MAX WAIT_MS HOLD_MS ROUNDS LOG
//
// MODE semaphore: InterProcessSemaphoreV2(PATH, MAX), one lease per round.
// MODE mutex: InterProcessSemaphoreMutex(PATH) (MAX ignored).
//   Prints CONNECTED, then per round ACQUIRED <lease node name> (or TIMEOUT, and it stops), then
//   RELEASING and RELEASED; DONE after ROUNDS rounds. A negative HOLD_MS holds until a line (or the
//   end) on standard input. With LOG (not "-"), every grant and every return is appended to the
//   shared log LOG as a PERSISTENT_SEQUENTIAL child "e-" with the data "enter <who>" (after the
//   grant) or "exit <who>" (before the return): the ensemble orders the log, so a replay counts
//   the leases believed held at every point, across processes and languages.
// MODE revocable: InterProcessMutex(PATH) made revocable; prints ACQUIRED, then REVOKE_REQUESTED
//   when its RevocationListener is called (it keeps the lock: revocation is advisory); releases on
//   a line (or the end) on standard input: RELEASING, RELEASED.
// MODE revoke: Revoker.attemptRevoke(PATH) (PATH is a lock node); prints REVOKED.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.Revoker;
import org.apache.curator.retry.RetryOneTime;
import org.apache.zookeeper.CreateMode;

public class CuratorSemaphoreHolder {
    static CuratorFramework client;
    static String log;
    static final BufferedReader IN = new BufferedReader(new InputStreamReader(System.in));

    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static void append(String event) throws Exception {
        if (!log.equals("-")) {
            client.create().creatingParentContainersIfNeeded().withMode(CreateMode.PERSISTENT_SEQUENTIAL)
                .forPath(log + "/e-", event.getBytes(StandardCharsets.UTF_8));
        }
    }

    static void hold(long holdMs) throws Exception {
        if (holdMs < 0) {
            IN.readLine();
        } else {
            Thread.sleep(holdMs);
        }
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1], mode = args[2];
        int max = Integer.parseInt(args[3]);
        long waitMs = Long.parseLong(args[4]), holdMs = Long.parseLong(args[5]);
        int rounds = Integer.parseInt(args[6]);
        log = args[7];
        client = CuratorFrameworkFactory.newClient(connect, 10000, 10000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        say("CONNECTED");
        String who = "curator-" + ProcessHandle.current().pid();
        switch (mode) {
            case "semaphore":
            case "mutex": {
                InterProcessSemaphoreV2 semaphore = mode.equals("semaphore") ? new InterProcessSemaphoreV2(client, path, max) : null;
                InterProcessSemaphoreMutex mutex = mode.equals("mutex") ? new InterProcessSemaphoreMutex(client, path) : null;
                for (int round = 0; round < rounds; round++) {
                    String me = who + "-" + round;
                    if (semaphore != null) {
                        Lease lease = semaphore.acquire(waitMs, TimeUnit.MILLISECONDS);
                        if (lease == null) {
                            say("TIMEOUT");
                            break;
                        }
                        append("enter " + me);
                        say("ACQUIRED " + lease.getNodeName());
                        hold(holdMs);
                        append("exit " + me);
                        say("RELEASING");
                        lease.close();
                    } else {
                        if (!mutex.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                            say("TIMEOUT");
                            break;
                        }
                        append("enter " + me);
                        say("ACQUIRED");
                        hold(holdMs);
                        append("exit " + me);
                        say("RELEASING");
                        mutex.release();
                    }
                    say("RELEASED");
                }
                say("DONE");
                break;
            }
            case "revocable": {
                InterProcessMutex mutex = new InterProcessMutex(client, path);
                mutex.makeRevocable(forLock -> say("REVOKE_REQUESTED"));
                if (!mutex.acquire(waitMs, TimeUnit.MILLISECONDS)) {
                    say("TIMEOUT");
                    break;
                }
                say("ACQUIRED");
                IN.readLine();
                say("RELEASING");
                mutex.release();
                say("RELEASED");
                break;
            }
            case "revoke":
                Revoker.attemptRevoke(client, path);
                say("REVOKED");
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        client.close();
    }
}
