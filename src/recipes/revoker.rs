//! [`Revoker`]: asks the holder of a revocable lock node to release it (Curator's `Revoker`).

use crate::error::{Error, Result};
use crate::hold::guard::REVOKE_MESSAGE;
use crate::session::cleanup::retry_unknown;
use crate::session::client::RecipeClient;
use zookeeper_client as zk;

/// Asks for a lock back (Curator's `Revoker`): writes `__REVOKE__` as the data of a lock node,
/// which a holder that made its lock [`revocable`](crate::LockBuilder::revocable) sees through
/// [`LockGuard::revoke_requested`](crate::LockGuard::revoke_requested) — ours or Curator's (its
/// `RevocationListener`). Advisory: the holder decides whether to release.
///
/// ```no_run
/// # async fn demo(client: zk_recipes::ManagedClient) -> zk_recipes::Result<()> {
/// use zk_recipes::{InterProcessMutex, Revoker};
///
/// let mutex = InterProcessMutex::new(&client, "/locks/report")?;
/// // Ask whoever holds the lock now to give it up:
/// if let Some(holder) = mutex.participants().await?.into_iter().find(|p| p.is_holder) {
///     Revoker::attempt_revoke(&client, &holder.path).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Revoker;

impl Revoker {
    /// Writes the revocation request to the lock node at `node_path` (a full node path, e.g.
    /// [`LockGuard::lock_path`](crate::LockGuard::lock_path) or a
    /// [`Participant::path`](crate::Participant)). `Ok` also when the node no longer exists: its
    /// hold has already ended.
    ///
    /// # Errors
    /// [`Error::NoAuth`] if we may not write the node, [`Error::SessionLost`] if the session is
    /// dead, [`Error::ZooKeeper`] for other failures.
    pub async fn attempt_revoke(client: impl Into<RecipeClient>, node_path: &str) -> Result<()> {
        crate::engine::path::validate_syntax(node_path)?;
        let client: RecipeClient = client.into();
        let context = client.context();
        match retry_unknown(|| context.client().set_data(node_path, REVOKE_MESSAGE, None)).await {
            Ok(_) | Err(zk::Error::NoNode) => Ok(()),
            Err(err) => Err(Error::zk("write the revocation request to", node_path, err)),
        }
    }
}
