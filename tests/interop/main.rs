//! Interoperation with the peers, on one server: Curator (Debian's 5.4 jars, and the 5.5+ layouts
//! written from source) and kazoo holding the same lock paths as this crate, through the holders
//! in this folder (`CuratorHolder.java`, `kazoo_holder.py`, ...). Each module was its own test
//! binary; one binary compiles and links once.
//!
//! Tests here run beside tests of other modules (two at a time), each with peer processes of its
//! own on paths of its own.

#[path = "../common/mod.rs"]
mod common;

mod curator_interop;
mod leader_interop;
mod mixed_interop;
mod rw_interop;
mod semaphore_interop;
