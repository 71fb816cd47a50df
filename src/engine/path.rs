//! Validation of user-supplied lock paths.

use crate::error::{Error, Result};

/// Checks that `path` is an absolute, normalised ZooKeeper path usable as a lock path, as recipe
/// builders do — for tools that want to refuse a bad path before connecting.
///
/// Characters are checked as the server checks them (Java's `PathUtils.validatePath`), on the
/// path's UTF-16 form: control characters, private-use characters (U+E000–U+F8FF), U+FFF0–U+FFFF
/// and every character outside the Basic Multilingual Plane (an emoji, sent as a UTF-16
/// surrogate pair, U+D800–U+DFFF) are refused.
///
/// A path in `/zookeeper` is refused: without a chroot the server reserves it. This function
/// knows of no client, so it refuses it always; [`MutexBuilder::build`](crate::MutexBuilder::build)
/// accepts it on a client with a chroot, where the server sees `<chroot>/zookeeper/...`.
///
/// # Errors
/// [`Error::InvalidPath`], saying what is wrong, instead of letting the client library panic or
/// the server reject the path later.
pub fn validate_lock_path(path: &str) -> Result<()> {
    validate_syntax(path)?;
    refuse_reserved(path, path)
}

/// `path` (absolute, under the client's chroot) as the server names it: `chroot` is the client's
/// (`zookeeper_client::Client::path`, `/` for none). What identifies a znode across the clients
/// of a process (`view.rs`, `delay.rs`): the same path under two chroots is two znodes.
pub(crate) fn on_server(chroot: &str, path: &str) -> String {
    match (chroot, path) {
        ("/", path) => path.to_owned(),
        (chroot, "/") => chroot.to_owned(),
        (chroot, path) => format!("{chroot}{path}"),
    }
}

/// Everything [`validate_lock_path`] checks but the reserved `/zookeeper` subtree, which depends
/// on the client's chroot (see [`refuse_reserved`]).
pub(crate) fn validate_syntax(path: &str) -> Result<()> {
    let invalid = |reason| Err(Error::InvalidPath { path: path.to_owned(), reason });
    if path.is_empty() {
        return invalid("the path is empty");
    }
    if !path.starts_with('/') {
        return invalid("the path must start with '/'");
    }
    if path == "/" {
        return invalid("the root node cannot be a lock path; use a path such as /locks/NAME");
    }
    if path.ends_with('/') {
        return invalid("the path must not end with '/'");
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return invalid("the path has an empty segment ('//')");
        }
        if segment == "." || segment == ".." {
            return invalid("relative segments '.' and '..' are not allowed");
        }
    }
    if let Some(reason) = path.chars().find_map(forbidden_char) {
        return invalid(reason);
    }
    Ok(())
}

/// Refuses `path` (as given) if `server_path` — the path the server sees, the client's chroot
/// prepended — is in the `/zookeeper` subtree the server reserves.
pub(crate) fn refuse_reserved(path: &str, server_path: &str) -> Result<()> {
    if server_path.starts_with("/zookeeper/") || server_path == "/zookeeper" {
        return Err(Error::InvalidPath { path: path.to_owned(), reason: "/zookeeper is reserved by the server" });
    }
    Ok(())
}

/// Why ZooKeeper's `PathUtils.validatePath` rejects `c`, if it does. The server checks UTF-16 code
/// units: `\u0000`-`\u001f`, `\u007f`-`\u009f`, `\ud800`-`\uf8ff` and `\ufff0`-`\uffff`. A `char` is
/// never a surrogate itself, but one outside the BMP is sent as two surrogates (`\ud800`-`\udfff`).
fn forbidden_char(c: char) -> Option<&'static str> {
    match c {
        '\u{0000}'..='\u{001f}' | '\u{007f}'..='\u{009f}' => Some("the path contains a control character"),
        '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}' => {
            Some("the path contains a private-use or non-character code point (U+E000-U+F8FF, U+FFF0-U+FFFF)")
        },
        '\u{10000}'.. => Some(
            "the path contains a character outside the Basic Multilingual Plane (e.g. an emoji): ZooKeeper sees it as UTF-16 surrogates, which it refuses",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_paths() {
        for p in ["/a", "/locks/orders", "/a-b/c_d/é", "/a/.b", "/a/b..", "/a/\u{d7ff}", "/a/\u{f900}", "/a/\u{ffef}"]
        {
            assert!(validate_lock_path(p).is_ok(), "{p}");
        }
    }

    #[test]
    fn rejects_bad_paths() {
        for p in [
            "",
            "a",
            "locks/x",
            "/",
            "/a/",
            "/a//b",
            "/a/./b",
            "/a/..",
            "/a\u{0}b",
            "/a\nb",
            "/zookeeper",
            "/zookeeper/quota",
            "/a/\u{7f}",
            "/a/\u{9f}",
            "/a/\u{e000}",
            "/a/\u{f8ff}",
            "/a/\u{fff0}",
            "/a/\u{ffff}",
            "/a/\u{10000}",
            "/orders-\u{1F512}",
            "/a/\u{10ffff}",
        ] {
            match validate_lock_path(p) {
                Err(Error::InvalidPath { path, reason }) => {
                    assert_eq!(path, p);
                    assert!(!reason.is_empty());
                },
                other => panic!("{p:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn says_why_a_character_is_refused() {
        let reason = |p: &str| match validate_lock_path(p) {
            Err(Error::InvalidPath { reason, .. }) => reason,
            other => panic!("{p:?} gave {other:?}"),
        };
        assert!(reason("/orders-\u{1F512}").contains("outside the Basic Multilingual Plane"));
        assert!(reason("/a\tb").contains("control character"));
        assert!(reason("/a\u{e000}").contains("private-use"));
    }

    #[test]
    fn zookeeper_is_reserved_only_as_the_server_sees_it() {
        assert!(validate_syntax("/zookeeper/locks").is_ok());
        assert!(refuse_reserved("/zookeeper/locks", "/app/zookeeper/locks").is_ok());
        assert_eq!(on_server("/", "/locks/a"), "/locks/a");
        assert_eq!(on_server("/app", "/locks/a"), "/app/locks/a");
        assert_eq!(on_server("/app", "/"), "/app");
        assert!(refuse_reserved("/zookeeperx", "/zookeeperx").is_ok());
        assert!(refuse_reserved("/locks", "/zookeeper/locks").is_err());
        assert!(refuse_reserved("/zookeeper", "/zookeeper").is_err());
    }
}
