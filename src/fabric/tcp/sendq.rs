//! A TCP queue pair's send queue: requests wait here to go on the wire, and exactly one party
//! at a time holds the *turn* to send (a poster sending inline, or the sender thread), popping
//! in order, so wire order is post order and sequence numbers have no gaps.
//!
//! It knows nothing of sockets, so the model checker can explore it (see the `model_` tests):
//! posters racing the sender thread, back-pressure on a full queue, and the close.

use crate::sync::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;

struct State<T> {
    queue: VecDeque<T>,
    /// Someone holds the turn.
    sending: bool,
    closed: bool,
    next_seq: u64,
}

pub struct SendQueue<T> {
    state: Mutex<State<T>>,
    /// Signalled when there is work for the sender thread.
    work: Condvar,
    /// Signalled when the queue has room again.
    space: Condvar,
    depth: usize,
}

/// The right to send: whoever holds it pops and sends, in order. Dropping it hands the turn
/// back and wakes the sender thread if work is left.
pub struct Turn<'a, T> {
    q: &'a SendQueue<T>,
}

impl<T> SendQueue<T> {
    /// A queue that holds at most `depth` requests before `push` waits for room.
    pub fn new(depth: usize) -> SendQueue<T> {
        SendQueue {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(depth),
                sending: false,
                closed: false,
                next_seq: 0,
            }),
            work: Condvar::new(),
            space: Condvar::new(),
            depth: depth.max(1),
        }
    }

    /// Queues `item`, waiting while the queue is full. Gives the item back if the queue is
    /// closed or `dead()` says the connection failed.
    pub fn push(&self, item: T, dead: &dyn Fn() -> bool) -> Result<(), T> {
        let mut st = self.state.lock();
        while st.queue.len() >= self.depth && !st.closed && !dead() {
            self.work.notify_one();
            st = self.space.wait(st);
        }
        if st.closed || dead() {
            return Err(item);
        }
        st.queue.push_back(item);
        Ok(())
    }

    /// Takes the turn if nobody holds it, work is queued and `inline(head, queued)` says the
    /// caller should send it itself; otherwise leaves queued work to the sender thread.
    pub fn take_turn(&self, inline: impl Fn(&T, usize) -> bool) -> Option<Turn<'_, T>> {
        let mut st = self.state.lock();
        if st.sending {
            return None; // whoever is sending will get to it
        }
        match st.queue.front() {
            Some(head) if inline(head, st.queue.len()) => {
                st.sending = true;
                Some(Turn { q: self })
            }
            Some(_) => {
                self.work.notify_one();
                None
            }
            None => None,
        }
    }

    /// The sender thread's wait: the turn, once work is queued and nobody holds it; `None`
    /// once the queue is closed and empty.
    pub fn wait_turn(&self) -> Option<Turn<'_, T>> {
        let mut st = self.state.lock();
        loop {
            if !st.sending && !st.queue.is_empty() {
                st.sending = true;
                return Some(Turn { q: self });
            }
            if st.closed && st.queue.is_empty() {
                return None;
            }
            st = self.work.wait(st);
        }
    }

    /// No more requests: later pushes are refused, waiters wake, and the sender thread ends
    /// once the queue is empty.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        self.work.notify_all();
        self.space.notify_all();
    }

    fn release(&self, mut st: MutexGuard<'_, State<T>>) {
        st.sending = false;
        if !st.queue.is_empty() {
            self.work.notify_one();
        }
    }
}

impl<T> Turn<'_, T> {
    /// Pops the head with its sequence number if `take(head)` agrees.
    pub fn next(&mut self, take: impl Fn(&T) -> bool) -> Option<(T, u64)> {
        let mut st = self.q.state.lock();
        if !st.queue.front().is_some_and(take) {
            return None;
        }
        let item = st.queue.pop_front().expect("non-empty");
        let seq = st.next_seq;
        st.next_seq += 1;
        self.q.space.notify_one();
        Some((item, seq))
    }
}

impl<T> Drop for Turn<'_, T> {
    fn drop(&mut self) {
        let st = self.q.state.lock();
        self.q.release(st);
    }
}

#[cfg(all(test, feature = "shuttle"))]
mod model_tests {
    use super::*;
    use crate::sync::thread;
    use crate::sync::Arc;

    type Wire = (Mutex<Vec<((u32, u32), u64)>>, Condvar);

    fn put_on_wire(wire: &Wire, x: ((u32, u32), u64)) {
        wire.0.lock().push(x);
        wire.1.notify_all();
    }

    /// Two posters race the sender thread over a queue of depth 2. Poster 0 sends one item
    /// inline whenever it gets the turn, poster 1 leaves its items to the sender thread.
    /// Every item goes on the "wire" exactly once, in sequence order with no gap, each
    /// poster's items in its own order, and all of them get there before the queue is closed:
    /// a lost wake-up leaves an item queued with the sender asleep and the main thread waiting
    /// for it, which shuttle reports as a deadlock.
    #[test]
    fn model_send_queue_keeps_post_order_and_loses_no_wakeup() {
        shuttle::check_random(
            || {
                let q = Arc::new(SendQueue::<(u32, u32)>::new(2));
                let wire: Arc<Wire> = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
                let sender = {
                    let (q, wire) = (q.clone(), wire.clone());
                    thread::spawn(move || {
                        while let Some(mut turn) = q.wait_turn() {
                            if let Some(x) = turn.next(|_| true) {
                                put_on_wire(&wire, x);
                            }
                        }
                    })
                };
                let posters: Vec<_> = (0..2u32)
                    .map(|p| {
                        let (q, wire) = (q.clone(), wire.clone());
                        thread::spawn(move || {
                            for i in 0..3u32 {
                                q.push((p, i), &|| false).unwrap();
                                if let Some(mut turn) = q.take_turn(|_, _| p == 0) {
                                    if let Some(x) = turn.next(|_| true) {
                                        put_on_wire(&wire, x);
                                    }
                                }
                            }
                        })
                    })
                    .collect();
                for p in posters {
                    p.join().unwrap();
                }
                {
                    let mut sent = wire.0.lock();
                    while sent.len() < 6 {
                        sent = wire.1.wait(sent);
                    }
                }
                q.close();
                sender.join().unwrap();
                let sent = wire.0.lock();
                assert_eq!(sent.len(), 6);
                for (k, (_, seq)) in sent.iter().enumerate() {
                    assert_eq!(*seq, k as u64, "wire order is not sequence order");
                }
                for p in 0..2 {
                    let mine: Vec<u32> = sent
                        .iter()
                        .filter(|((q, _), _)| *q == p)
                        .map(|((_, i), _)| *i)
                        .collect();
                    assert_eq!(mine, vec![0, 1, 2], "poster {p}'s order");
                }
                assert!(
                    q.push((9, 9), &|| false).is_err(),
                    "closed queue took an item"
                );
            },
            3000,
        );
    }
}
