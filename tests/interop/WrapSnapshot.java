// Writes a ZooKeeper data directory whose only user node, a persistent PATH without children,
// has the child counter CVERSION: ZooKeeper names the next sequential child of PATH
// <prefix><CVERSION> (`%010d` of the parent's stored cversion, a Java int). For
// tests/recipes/sequence_wrap.rs (the fixture: sequence_wrap_server in tests/common/interop.rs).
// usage: java -cp <zookeeper.jar:slf4j-nop.jar> WrapSnapshot.java DATA_DIR PATH CVERSION
// Writes DATA_DIR/version-2/snapshot.<zxid> (nothing else) and prints its path.
//
// The tree is built with ZooKeeper's own server classes (Debian's libzookeeper-java 3.8) and
// saved with FileTxnSnapLog.save, as the server saves its own snapshots. For CVERSION > 0 the
// state is one the server reaches itself, made the way it applies transactions:
//   zxid 1: create PATH
//   zxid 2: create PATH/seed with the parent's new cversion CVERSION (a create transaction
//           carries it: PrepRequestProcessor puts the parent's cversion + 1 there; DataTree sets
//           the parent's cversion to it, and its pzxid to this zxid)
//   zxid 3: delete PATH/seed (a delete leaves the stored cversion alone)
// A CVERSION <= 0 is set on the node directly: a server with ZOOKEEPER-3249 (3.8 has it) never
// stores such a counter, since DataTree only ever raises a cversion (after 2147483647 it stays
// there); servers from before it stored the wrapped value. The snapshot carries no tree digest
// (DataTree's is only kept for applied transactions), so the server computes its own at load.
//
// The stored cversion counts child creates. Clients see another number in Stat.cversion:
// 2 * stored - number of children (creates + deletes, DataNode.copyStat), wrapping sooner.
import java.io.File;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.server.DataNode;
import org.apache.zookeeper.server.DataTree;
import org.apache.zookeeper.server.persistence.FileTxnSnapLog;

public class WrapSnapshot {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: WrapSnapshot DATA_DIR PATH CVERSION");
            System.exit(2);
        }
        File dataDir = new File(args[0]);
        String path = args[1];
        int cversion = Integer.parseInt(args[2]);

        long time = System.currentTimeMillis();
        DataTree tree = new DataTree();
        long zxid = 1;
        tree.createNode(path, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, 0, -1, zxid, time);
        if (cversion > 0) {
            String seed = path + "/seed";
            zxid++;
            tree.createNode(seed, new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, 0, cversion, zxid, time);
            zxid++;
            tree.deleteNode(seed, zxid);
        } else {
            tree.getNode(path).stat.setCversion(cversion);
        }
        tree.lastProcessedZxid = zxid;

        DataNode node = tree.getNode(path);
        if (node.stat.getCversion() != cversion || !node.getChildren().isEmpty()) {
            throw new IllegalStateException("built " + path + " with cversion " + node.stat.getCversion()
                    + " and children " + node.getChildren() + ", wanted cversion " + cversion + " and none");
        }

        // Snapshots and transaction logs in the same directory: DATA_DIR/version-2/.
        FileTxnSnapLog snapLog = new FileTxnSnapLog(dataDir, dataDir);
        snapLog.save(tree, new ConcurrentHashMap<>(), true);
        snapLog.close();
        File written = snapLog.findMostRecentSnapshot();
        if (written == null) {
            throw new IllegalStateException("no snapshot in " + snapLog.getSnapDir());
        }
        System.out.println(written.getPath());
    }
}
