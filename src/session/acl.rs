//! [`AclList`]: the ACLs recipes give the nodes they create, however the caller spells them.

use zookeeper_client as zk;

/// A list of ZooKeeper ACLs, as the `acls` options of
/// [`ManagedClientBuilder`](crate::ManagedClientBuilder::acls) and
/// [`MutexBuilder`](crate::MutexBuilder::acls) take it: made from `zookeeper_client`'s own
/// [`Acls`](zk::Acls) (`Acls::creator_all()`, `Acls::anyone_all()`, ...), a `Vec<Acl>` or a slice
/// of them.
///
/// ```
/// use zk_recipes::{zookeeper_client as zk, AclList};
/// let a: AclList = zk::Acls::creator_all().into();
/// let b: AclList = zk::Acls::creator_all().to_vec().into();
/// assert_eq!(a, b);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclList(Vec<zk::Acl>);

impl AclList {
    /// The ACLs, in order.
    pub fn as_slice(&self) -> &[zk::Acl] {
        &self.0
    }
}

impl From<AclList> for Vec<zk::Acl> {
    fn from(list: AclList) -> Vec<zk::Acl> {
        list.0
    }
}

impl From<Vec<zk::Acl>> for AclList {
    fn from(acls: Vec<zk::Acl>) -> AclList {
        AclList(acls)
    }
}

impl From<&[zk::Acl]> for AclList {
    fn from(acls: &[zk::Acl]) -> AclList {
        AclList(acls.to_vec())
    }
}

impl From<zk::Acls<'_>> for AclList {
    fn from(acls: zk::Acls<'_>) -> AclList {
        AclList(acls.to_vec())
    }
}

impl From<&zk::Acls<'_>> for AclList {
    fn from(acls: &zk::Acls<'_>) -> AclList {
        AclList(acls.to_vec())
    }
}
