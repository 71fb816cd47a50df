//! Who is inside one read/write lock, as its holders see it — checked at every grant.
//!
//! A test that asserts exclusion by waiting a fixed window (`!task.is_finished()` after a sleep)
//! misses a grant that comes too late. With an [`Inside`] record, every acquirer says so right
//! after its acquire returns ([`read_granted`](Inside::read_granted),
//! [`write_granted`](Inside::write_granted), [`downgrade_granted`](Inside::downgrade_granted)),
//! and every holder just before it releases ([`read_releasing`](Inside::read_releasing),
//! [`write_releasing`](Inside::write_releasing)); a grant that the others' presence rules out
//! panics at that grant, whenever it comes.
//!
//! Sound: a grant is recorded after the acquire returned and a release before it is sent, so the
//! recorded stays are never longer than the real ones — an overlap recorded is an overlap that
//! happened.
//!
//! A holder granted against the rules is recorded inside all the same. A check that fails in a
//! spawned acquirer panics there (the test fails when it joins the task), and the holder's guard
//! is then dropped without a leave call, so later checks may fail because of it: every message
//! names the violations found before it, the first one is the cause.

use std::sync::{Arc, Mutex, MutexGuard};

/// A holder inside the lock.
#[derive(Debug)]
struct Reader {
    who: String,
    /// A downgraded read of the write holder (allowed beside its own write hold).
    downgraded: bool,
}

#[derive(Debug, Default)]
struct State {
    writer: Option<String>,
    readers: Vec<Reader>,
    /// Everyone granted so far, in grant order.
    granted: Vec<String>,
    /// The violations found so far.
    violations: Vec<String>,
}

impl State {
    /// Records a violation; the panic message, with the earlier violations.
    fn violation(&mut self, what: String) -> String {
        let message = if self.violations.is_empty() {
            format!(
                "{what}\n  inside: writer {:?}, readers {:?}; granted so far: {:?}",
                self.writer, self.readers, self.granted
            )
        } else {
            format!(
                "{what}\n  inside: writer {:?}, readers {:?}; granted so far: {:?}\n  after earlier violations (the \
                 first is the cause): {:?}",
                self.writer, self.readers, self.granted, self.violations
            )
        };
        self.violations.push(what);
        message
    }
}

/// The "who is inside" record of one read/write lock (share it with `Arc`).
#[derive(Debug, Default)]
pub struct Inside {
    state: Mutex<State>,
}

impl Inside {
    pub fn new() -> Arc<Inside> {
        Arc::default()
    }

    /// Runs `check` on the state (also after a check panicked in another task); panics with its
    /// violation, if any.
    #[track_caller]
    fn check(&self, check: impl FnOnce(&mut State) -> Result<(), String>) {
        let outcome = {
            let mut state = self.state();
            check(&mut state).map_err(|what| state.violation(what))
        };
        if let Err(message) = outcome {
            panic!("{message}");
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A read of `who` was granted: no writer may be inside.
    #[track_caller]
    pub fn read_granted(&self, who: &str) {
        self.check(|state| {
            let outcome = match &state.writer {
                Some(writer) => Err(format!("{who} was granted a read while {writer} holds the write lock")),
                None => Ok(()),
            };
            // Inside, whether it should be or not.
            state.readers.push(Reader { who: who.to_owned(), downgraded: false });
            state.granted.push(who.to_owned());
            outcome
        });
    }

    /// A write of `who` was granted: nobody may be inside.
    #[track_caller]
    pub fn write_granted(&self, who: &str) {
        if let Err(message) = self.try_write_granted(who) {
            panic!("{message}");
        }
    }

    /// As [`write_granted`](Self::write_granted), returning the violation (recorded all the same)
    /// instead of panicking: for a test that reports it after assertions of its own.
    pub fn try_write_granted(&self, who: &str) -> Result<(), String> {
        let mut state = self.state();
        let outcome = if state.writer.is_some() || !state.readers.is_empty() {
            Err(state.violation(format!("{who} was granted the write lock while others are inside")))
        } else {
            Ok(())
        };
        // Inside, whether it should be or not (the earlier writer, if any, is no longer recorded).
        state.writer = Some(who.to_owned());
        state.granted.push(who.to_owned());
        outcome
    }

    /// The write holder `who` downgraded: a read granted beside its own write hold.
    #[track_caller]
    pub fn downgrade_granted(&self, who: &str) {
        self.check(|state| {
            if state.writer.as_deref() != Some(who) {
                return Err(format!("{who} downgraded without holding the write lock"));
            }
            state.readers.push(Reader { who: who.to_owned(), downgraded: true });
            state.granted.push(format!("{who} (downgraded read)"));
            Ok(())
        });
    }

    /// `who` was granted (call right after its grant check) only after `earlier` was: the order
    /// a fair queue promises.
    #[track_caller]
    pub fn granted_after(&self, who: &str, earlier: &str) {
        self.check(|state| {
            if state.granted.iter().any(|granted| granted == earlier) {
                Ok(())
            } else {
                Err(format!("{who} was granted before {earlier}, which was queued ahead of it"))
            }
        });
    }

    /// `who` is about to release its read (downgraded or not).
    #[track_caller]
    pub fn read_releasing(&self, who: &str) {
        self.check(|state| match state.readers.iter().position(|reader| reader.who == who) {
            Some(i) => {
                state.readers.remove(i);
                Ok(())
            },
            None => Err(format!("{who} releases a read it was not recorded holding")),
        });
    }

    /// `who` is about to release its write lock.
    #[track_caller]
    pub fn write_releasing(&self, who: &str) {
        self.check(|state| {
            if state.writer.as_deref() != Some(who) {
                return Err(format!("{who} releases a write lock it was not recorded holding"));
            }
            state.writer = None;
            Ok(())
        });
    }
}
