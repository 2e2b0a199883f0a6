//! The one place rmemfs takes its locks, condition variables and atomics from.
//!
//! Two reasons. First, a model checker: built with the `shuttle` feature, every primitive here
//! is shuttle's, so a test can explore the interleavings of the real data-path code (batch
//! completion, FRRWP's reply-versus-submit race, the registration cache, the TCP send queue)
//! instead of hoping the clock finds them. Second, fault containment: a panic that unwinds
//! through a held lock poisons it, and `lock().unwrap()` everywhere turned one bug into a
//! cascade that took the mount down. Here a poisoned lock is logged and taken over: the panic
//! already failed its own request (see `fuse.rs`), and every structure behind these locks is
//! kept consistent at each await point, so the next user may proceed.
//!
//! Built with `shuttle`, the library must only run inside `shuttle::check_*` (the model
//! tests); the normal build uses `std`.

#[cfg(feature = "shuttle")]
use shuttle::sync as imp;
#[cfg(not(feature = "shuttle"))]
use std::sync as imp;

pub use std::sync::{Arc, Weak};

/// Atomics (shuttle's under the model checker, so each access is a scheduling point).
pub mod atomic {
    #[cfg(feature = "shuttle")]
    pub use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    #[cfg(not(feature = "shuttle"))]
    pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
}

/// Threads (shuttle's under the model checker).
pub mod thread {
    #[cfg(feature = "shuttle")]
    pub use shuttle::thread::{spawn, yield_now, JoinHandle};
    #[cfg(not(feature = "shuttle"))]
    pub use std::thread::{spawn, yield_now, JoinHandle};
}

fn taken_over(what: &str) {
    log::error!("a {what} was poisoned by a panic in another thread; continuing with its state");
}

/// A mutex whose `lock` never fails: a poisoned lock is logged and taken over.
#[derive(Default)]
pub struct Mutex<T: ?Sized>(imp::Mutex<T>);

pub type MutexGuard<'a, T> = imp::MutexGuard<'a, T>;
pub type RwLockReadGuard<'a, T> = imp::RwLockReadGuard<'a, T>;
pub type RwLockWriteGuard<'a, T> = imp::RwLockWriteGuard<'a, T>;

impl<T> Mutex<T> {
    pub fn new(value: T) -> Mutex<T> {
        Mutex(imp::Mutex::new(value))
    }
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|p| {
            taken_over("mutex");
            p.into_inner()
        })
    }
    /// The guard if the lock is free now (a poisoned lock is taken over).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                taken_over("mutex");
                Some(p.into_inner())
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Mutex").field(&&*self.lock()).finish()
    }
}

/// A condition variable for [`Mutex`].
#[derive(Default)]
pub struct Condvar(imp::Condvar);

impl Condvar {
    pub fn new() -> Condvar {
        Condvar(imp::Condvar::new())
    }
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.0.wait(guard).unwrap_or_else(|p| {
            taken_over("mutex");
            p.into_inner()
        })
    }
    /// Waits up to `timeout`; true in the second place if it timed out.
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> (MutexGuard<'a, T>, bool) {
        let (g, res) = self.0.wait_timeout(guard, timeout).unwrap_or_else(|p| {
            taken_over("mutex");
            p.into_inner()
        });
        (g, res.timed_out())
    }
    pub fn notify_one(&self) {
        self.0.notify_one()
    }
    pub fn notify_all(&self) {
        self.0.notify_all()
    }
}

impl std::fmt::Debug for Condvar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Condvar")
    }
}

/// A reader-writer lock whose guards never fail (see [`Mutex`]).
#[derive(Default)]
pub struct RwLock<T: ?Sized>(imp::RwLock<T>);

impl<T> RwLock<T> {
    pub fn new(value: T) -> RwLock<T> {
        RwLock(imp::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> imp::RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(|p| {
            taken_over("rwlock");
            p.into_inner()
        })
    }
    pub fn write(&self) -> imp::RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(|p| {
            taken_over("rwlock");
            p.into_inner()
        })
    }
    /// The write guard if the lock is free now (a poisoned lock is taken over).
    pub fn try_write(&self) -> Option<imp::RwLockWriteGuard<'_, T>> {
        match self.0.try_write() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                taken_over("rwlock");
                Some(p.into_inner())
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RwLock").field(&&*self.read()).finish()
    }
}

/// A pause that doubles at each use up to a ceiling: how every retry loop here waits (a lock,
/// a turn, a catch-up, a lost answer, a reconnect, an upkeep round that panicked), so that a
/// busy peer is asked again soon at first and is never flooded after.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    first: std::time::Duration,
    current: std::time::Duration,
    most: std::time::Duration,
}

impl Backoff {
    /// Starts at `first`, doubling up to `most`.
    pub const fn new(first: std::time::Duration, most: std::time::Duration) -> Backoff {
        Backoff {
            first,
            current: first,
            most,
        }
    }

    /// The pause to wait now.
    pub fn current(&self) -> std::time::Duration {
        self.current
    }

    /// Doubles the pause (at most the ceiling) and returns it.
    pub fn grow(&mut self) -> std::time::Duration {
        self.current = self.current.saturating_mul(2).min(self.most);
        self.current
    }

    /// Sleeps the current pause, then doubles it.
    pub fn sleep(&mut self) {
        std::thread::sleep(self.current);
        self.grow();
    }

    /// Back to the first pause (the peer answered).
    pub fn reset(&mut self) {
        self.current = self.first;
    }

    /// Straight to the ceiling (asking again soon would not help).
    pub fn exhaust(&mut self) {
        self.current = self.most;
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_taken_over() {
        let m = Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let mut g = m2.lock();
            *g = 2;
            panic!("injected");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*m.lock(), 2);
    }

    #[test]
    fn a_backoff_doubles_to_its_ceiling_and_starts_over() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(1), ms(5));
        let seen: Vec<Duration> = (0..5).map(|_| b.grow()).collect();
        assert_eq!(seen, [ms(2), ms(4), ms(5), ms(5), ms(5)]);
        b.reset();
        assert_eq!(b.current(), ms(1));
        b.exhaust();
        assert_eq!(b.current(), ms(5));
    }
}
