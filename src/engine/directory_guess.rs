//! A new lock path: whether an acquire's first create guesses its directory missing.
//!
//! An acquire does not know whether its lock path's directory exists, and a wrong guess costs a
//! write the server refuses — an error transaction it still logs and commits — and a listing:
//! - guessed to exist (Curator's guess): the plain create, answered `NoNode` for a new path, and
//!   the listing behind it (of a missing directory); then the `multi` that creates the directory
//!   with our node;
//! - guessed missing: that `multi` first, answered `NodeExists` for a directory that exists; then
//!   the plain create. The listing behind a guessed `multi` is sent only where a plain create's
//!   would be (the acquire alone among the process's for that directory, `listing::Setup`), and
//!   then lists the whole directory, where Curator's guess wastes a listing of a missing one.
//!   Without it, a guessed `multi` applied costs a read of our node for its czxid.
//!
//! Right, either costs one write and the listing behind it. A burst of new lock paths (a service
//! taking its locks at start) guessed to exist asks the server for 5 requests per lock where 3 do
//! (BENCHMARKS.md, *Where a burst's time goes*).
//!
//! So the guess is learned per session, as a processor predicts a branch: a saturating counter
//! from 0 to 3, counted up by a create that found its directory missing and down by one that found
//! it, and the directory is guessed missing from 2. A session starts at 0, Curator's guess: a
//! service whose acquires find their directories (the same locks taken again and again) pays
//! nothing for it; one that takes new lock paths pays two wrong guesses, then none (in a burst,
//! also the acquires whose create went out before the second `NoNode` was counted: `hold_cost`
//! bounds them by the session's window of creates, and one). A pattern made to defeat the counter
//! pays a wrong guess at every acquire, as Curator's guess pays at every new lock path.
//!
//! The counter lives in the session's `SessionContext`, which a plain client's session keeps only
//! while one of its recipe objects lives (a managed client's, while the client does): a service
//! that makes a mutex per acquire and drops it, on a plain client and nothing else alive, starts
//! from Curator's guess every time.
//!
//! # Only what is sent first
//! A guess never decides an outcome:
//! - A guessed `multi` refused for any reason is followed by the plain create, as if it had not
//!   been sent: the directory exists, or `NoAuth` because its parent is not ours to create in (the
//!   server checks that before whether the node exists), or anything else. Only the plain
//!   create's `NoNode` makes the directory known missing, and then the `multi` is sent as it
//!   always was. So an acquire returns the errors it returned without the guess.
//! - Applied, a guessed `multi` is the `multi` a known-missing directory gets: the directory (and
//!   nothing above it) created with our node, all or nothing (`create_with_levels`), its czxid
//!   from the listing behind it (`created_with_directory`) or read from the node.
//! - Neither order changes where our node is or which requests follow it: the grant rests on the
//!   listing after the create that succeeded, either way.

use std::sync::atomic::{AtomicU8, Ordering};

/// The counter's top: two wrong guesses in a row change it, from either end.
const TOP: u8 = 3;
/// From here, the directory is guessed missing.
const MISSING_FROM: u8 = 2;

/// Whether a session whose acquires found `guess` (`SessionContext::directory_guess`) guesses
/// the next directory missing.
pub(super) fn missing(guess: &AtomicU8) -> bool {
    guess.load(Ordering::Relaxed) >= MISSING_FROM
}

/// A create found its directory missing (`true`) or there (`false`).
pub(super) fn found(guess: &AtomicU8, missing: bool) {
    // A hint: no ordering with anything else (every value is a valid guess).
    let step = |count: u8| Some(if missing { (count + 1).min(TOP) } else { count.saturating_sub(1) });
    let _ = guess.fetch_update(Ordering::Relaxed, Ordering::Relaxed, step);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_wrong_guesses_in_a_row_change_it() {
        let guess = AtomicU8::new(0);
        assert!(!missing(&guess), "a session starts with Curator's guess");
        found(&guess, true);
        assert!(!missing(&guess), "one new directory is not a trend");
        found(&guess, true);
        assert!(missing(&guess));
        for _ in 0..10 {
            found(&guess, true);
        }
        found(&guess, false);
        assert!(missing(&guess), "saturated: one directory found does not change it");
        found(&guess, false);
        assert!(!missing(&guess));
        for _ in 0..10 {
            found(&guess, false);
        }
        assert_eq!(guess.load(Ordering::Relaxed), 0);
        found(&guess, true);
        assert!(!missing(&guess), "saturated at the bottom too");
    }

    #[test]
    fn alternation_from_the_start_keeps_curators_guess() {
        let guess = AtomicU8::new(0);
        for _ in 0..10 {
            found(&guess, true);
            assert!(!missing(&guess));
            found(&guess, false);
            assert!(!missing(&guess));
        }
    }
}
