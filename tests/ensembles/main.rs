//! The fault tests that need a real 3-server ensemble (zone partitions, a killed leader, a lost
//! majority) for the mutex, leader election, the semaphore, lock-delay and hold leases. Each
//! module was its own test binary; one binary compiles and links once.

#[path = "../common/mod.rs"]
mod common;

mod delay_ensemble;
mod ensemble;
mod leader_ensemble;
mod lease_ensemble;
mod semaphore_ensemble;

/// One ensemble at a time: three ZooKeeper servers, their proxies and the partitions' timing are
/// as much as a loaded 2-core machine runs without stretching the bounds the tests assert. Every
/// test here takes it first (the lock is `tokio`'s, shared by the tests' runtimes).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
