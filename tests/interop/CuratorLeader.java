// Apache Curator's LeaderLatch or LeaderSelector on an election path, for tests/interop/leader_interop.rs.
// usage: java -cp <curator jars> CuratorLeader.java CONNECT PATH ID latch|selector MARKERS
// Prints CONNECTED once it has joined the election, then LEADER when it leads, and RELEASED once it
// stepped down (it steps down when its standard input is closed, and leaves the election).
// A line "who" on standard input prints "SEES <id>": the id of the leader Curator sees.
//
// While it leads it keeps the ephemeral node MARKERS/leader; the tests' leaders of every language
// do the same, so two leaders at once make one of them fail to create it: this program then
// prints "TWO LEADERS <error>" instead of "LEADER".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.retry.RetryOneTime;
import org.apache.zookeeper.CreateMode;

public class CuratorLeader {
    static CuratorFramework client;
    static String marker;

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static void lead() {
        try {
            client.create().withMode(CreateMode.EPHEMERAL).forPath(marker);
            say("LEADER");
        } catch (Exception e) {
            say("TWO LEADERS " + e);
        }
    }

    static void stepDown() throws Exception {
        client.delete().guaranteed().forPath(marker);
    }

    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1], id = args[2], mode = args[3];
        marker = args[4] + "/leader";
        client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        client.createContainers(args[4]);
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        if (mode.equals("latch")) {
            LeaderLatch latch = new LeaderLatch(client, path, id);
            latch.start();
            say("CONNECTED");
            Thread leader = new Thread(() -> {
                try {
                    latch.await();
                    lead();
                } catch (InterruptedException e) {
                    // closed before it led
                } catch (Exception e) {
                    say("ERROR " + e);
                }
            });
            leader.start();
            for (String line; (line = stdin.readLine()) != null; ) {
                if (line.equals("who")) {
                    say("SEES " + latch.getLeader().getId());
                }
            }
            if (latch.hasLeadership()) {
                stepDown();
            }
            latch.close();
            leader.interrupt();
            say("RELEASED");
        } else {
            CountDownLatch stop = new CountDownLatch(1), done = new CountDownLatch(1);
            AtomicBoolean leading = new AtomicBoolean();
            LeaderSelector selector = new LeaderSelector(client, path, new LeaderSelectorListenerAdapter() {
                @Override
                public void takeLeadership(CuratorFramework c) throws Exception {
                    leading.set(true);
                    try {
                        lead();
                        stop.await();
                        stepDown();
                    } finally {
                        done.countDown();
                    }
                }
            });
            selector.setId(id);
            selector.start();
            say("CONNECTED");
            for (String line; (line = stdin.readLine()) != null; ) {
                if (line.equals("who")) {
                    say("SEES " + selector.getLeader().getId());
                }
            }
            stop.countDown();
            if (leading.get()) {
                done.await();
            }
            selector.close();
            say("RELEASED");
        }
        client.close();
    }
}
