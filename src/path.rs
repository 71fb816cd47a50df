//! Validation of user-supplied lock paths.

use crate::error::{Error, Result};

/// Checks that `path` is an absolute, normalised ZooKeeper path usable as a lock path, as recipe
/// builders do — for tools that want to refuse a bad path before connecting.
///
/// # Errors
/// [`Error::InvalidPath`], saying what is wrong, instead of letting the client library panic or
/// the server reject the path later.
pub fn validate_lock_path(path: &str) -> Result<()> {
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
    if path.starts_with("/zookeeper/") || path == "/zookeeper" {
        return invalid("/zookeeper is reserved by the server");
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return invalid("the path has an empty segment ('//')");
        }
        if segment == "." || segment == ".." {
            return invalid("relative segments '.' and '..' are not allowed");
        }
    }
    if path.chars().any(is_forbidden_char) {
        return invalid("the path contains a control or non-character code point");
    }
    Ok(())
}

/// Characters ZooKeeper's `PathUtils.validatePath` rejects.
fn is_forbidden_char(c: char) -> bool {
    matches!(c, '\u{0000}'..='\u{001f}' | '\u{007f}'..='\u{009f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_normal_paths() {
        for p in ["/a", "/locks/orders", "/a-b/c_d/é", "/a/.b", "/a/b.."] {
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
}
