//! A catalog read by many and updated by one at a time, under an `InterProcessReadWriteLock`.
//!
//! Four readers, each with its own ZooKeeper session, read the catalog (a znode) under the read
//! lock; two editors take the write lock, bump the catalog's version with a write fenced by the
//! lock, then *downgrade*: they keep reading what they wrote under a read hold granted inside the
//! write scope, while other readers come in — and no editor can. The example checks what the lock
//! promises and exits non-zero otherwise:
//! - a reader never sees an editor inside, and editors never overlap (an in-process occupancy
//!   count);
//! - while a downgraded read lasts, the catalog keeps the version its editor wrote;
//! - readers overlapped (the point of a read lock), and every update landed.
//!
//! ```sh
//! cargo run --example catalog                            # starts ZooKeeper in a container
//! ZK_CONNECT=127.0.0.1:2181 cargo run --example catalog  # against a running server
//! ```

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zk_recipes::{InterProcessReadWriteLock, ManagedClient};
use zk_testcontainers::ZooKeeper;
use zookeeper_client as zk;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const READERS: usize = 4;
const EDITORS: usize = 2;
const UPDATES_PER_EDITOR: u64 = 10;
const READS_PER_READER: u64 = 40;

/// Who is inside, as the lock should allow it: readers count up from 0, an editor sets -1000.
#[derive(Default)]
struct Occupancy {
    inside: AtomicI64,
    violations: AtomicU64,
    /// The most readers seen inside at once.
    max_readers: AtomicI64,
}

impl Occupancy {
    fn enter_reader(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        if now < 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.max_readers.fetch_max(now, Ordering::SeqCst);
    }
    fn leave_reader(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
    fn enter_editor(&self) {
        if self.inside.fetch_sub(1000, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn leave_editor(&self) {
        self.inside.fetch_add(1000, Ordering::SeqCst);
    }
}

async fn catalog_version(client: &zk::Client, path: &str) -> Result<u64, BoxError> {
    let (data, _) = client.get_data(path).await?;
    Ok(String::from_utf8(data)?.parse()?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let zookeeper = ZooKeeper::start().await?;
    let connect = zookeeper.connect_string().to_owned();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (lock_path, catalog) = (format!("/examples/catalog-{run}/lock"), format!("/examples/catalog-{run}/data"));
    let admin = ManagedClient::connect(&connect).await?;
    admin
        .client()
        .mkdir(&format!("/examples/catalog-{run}"), &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()))
        .await?;
    admin.client().create(&catalog, b"0", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await?;
    let occupancy = Arc::new(Occupancy::default());
    let mut tasks = tokio::task::JoinSet::new();

    for reader in 0..READERS {
        let zk = ManagedClient::connect(&connect).await?;
        let (rw, occupancy, catalog) =
            (InterProcessReadWriteLock::new(&zk, &lock_path)?, occupancy.clone(), catalog.clone());
        tasks.spawn(async move {
            for _ in 0..READS_PER_READER {
                let guard = rw.read_lock().acquire().await?;
                occupancy.enter_reader();
                let version = catalog_version(&zk.client(), &catalog).await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
                occupancy.leave_reader();
                guard.release().await?;
                tracing::debug!(reader, version, "read");
            }
            zk.close().await?;
            Ok::<_, BoxError>(())
        });
    }
    for editor in 0..EDITORS {
        let zk = ManagedClient::connect(&connect).await?;
        let (rw, occupancy, catalog) =
            (InterProcessReadWriteLock::new(&zk, &lock_path)?, occupancy.clone(), catalog.clone());
        tasks.spawn(async move {
            for _ in 0..UPDATES_PER_EDITOR {
                let read = rw.read_lock();
                let (written, read_back) = rw
                    .write_lock()
                    .with_lock(|write_guard| {
                        let (zk, occupancy, catalog) = (zk.client(), occupancy.clone(), catalog.clone());
                        async move {
                            occupancy.enter_editor();
                            let version = catalog_version(&zk, &catalog).await? + 1;
                            // Fenced: applied only while our write node exists.
                            let mut write = write_guard.fenced_writer();
                            write.add_set_data(&catalog, version.to_string().as_bytes(), None)?;
                            write.commit().await?;
                            occupancy.leave_editor();
                            // The downgrade: granted at once (a read node beside our write node,
                            // Curator 5.5's layout), kept after the write scope ends.
                            let read_back = read.acquire().await?;
                            Ok::<_, BoxError>((version, read_back))
                        }
                    })
                    .await??;
                occupancy.enter_reader();
                // Other readers come in now (our write node is gone); no editor may: what we
                // wrote stays.
                for _ in 0..3 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let seen = catalog_version(&zk.client(), &catalog).await?;
                    if seen != written {
                        return Err(format!("editor {editor}: wrote {written}, saw {seen} during the downgrade").into());
                    }
                }
                occupancy.leave_reader();
                read_back.release().await?;
            }
            zk.close().await?;
            Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }

    let version = catalog_version(&admin.client(), &catalog).await?;
    let violations = occupancy.violations.load(Ordering::SeqCst);
    let max_readers = occupancy.max_readers.load(Ordering::SeqCst);
    println!("catalog version {version}; most readers inside at once: {max_readers}; violations: {violations}");
    admin.close().await?;
    if violations > 0 {
        return Err(format!("{violations} occupancy violations").into());
    }
    if version != EDITORS as u64 * UPDATES_PER_EDITOR {
        return Err(format!("catalog at version {version}, expected {}", EDITORS as u64 * UPDATES_PER_EDITOR).into());
    }
    if max_readers < 2 {
        return Err("readers never overlapped".into());
    }
    Ok(())
}
